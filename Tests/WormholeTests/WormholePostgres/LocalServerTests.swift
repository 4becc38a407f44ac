import Foundation
import Testing
import WormholeCLI

/// The fixtures the PostgreSQL tests stand on: a real server of their own, and hosts joined to it by links that can
/// be cut.
@Suite(
    "A local PostgreSQL server and network hosts",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .serialized,
    .timeLimit(.minutes(3))
)
struct LocalServerTests {
    /// `ping`, when the machine has it; otherwise host reachability is tried with a TCP connection to a server.
    static let ping = ["/usr/bin/ping", "/bin/ping", "/usr/sbin/ping", "/sbin/ping"]
        .first { FileManager.default.isExecutableFile(atPath: $0) }

    // Skipped where PostgreSQL is not installed: the reason says what to install.
    @Test(
        "A server answers, answers again after a crash and restart, and leaves nothing behind",
        .enabled(if: LocalPostgresServer.unavailableReason() == nil, "PostgreSQL is not installed")
    )
    func serverRestartsAndCloses() async throws { try await offThePool { try serverRestartsAndClosesBody() } }

    func serverRestartsAndClosesBody() throws {
        let server = try LocalPostgresServer()
        #expect(try server.psql("SELECT 1") == "1")
        #expect(try server.psql("SELECT current_user", user: "wormhole") == "wormhole")
        #expect(server.url == "postgres://wormhole@127.0.0.1:\(server.port)/wormhole?sslmode=disable")
        let first = server.processIdentifier
        try server.restart(mode: .immediate)
        #expect(server.processIdentifier != first)
        #expect(try server.psql("SELECT 1") == "1")
        server.close()
        #expect(!FileManager.default.fileExists(atPath: server.directory))
        // Its parent, init, reaps the postmaster shortly after it exits: until then kill() finds the zombie.
        #expect(eventually(timeout: 5) { kill(server.processIdentifier, 0) != 0 }, "the postmaster outlived close()")
        server.close()
    }

    // Skipped unless root can make network namespaces here, and, without ping, PostgreSQL is installed.
    @Test(
        "A host reaches the server until its link is cut, and again once it is restored",
        .enabled(if: NetworkHosts.unavailableReason() == nil, "network namespaces need root and iproute2"),
        .enabled(if: ping != nil || LocalPostgresServer.unavailableReason() == nil, "neither ping nor PostgreSQL")
    )
    func hostsLoseAndRegainTheServer() async throws { try await offThePool { try hostsLoseAndRegainTheServerBody() } }

    func hostsLoseAndRegainTheServerBody() throws {
        let hosts = try NetworkHosts(count: 2)
        defer { hosts.close() }
        #expect(hosts.serverAddresses == [hosts.serverAddress(0), hosts.serverAddress(1)])
        #expect(hosts.hostAddress(0) != hosts.hostAddress(1))
        let server = try Self.ping == nil ? LocalPostgresServer(listenAddresses: hosts.serverAddresses) : nil
        defer { server?.close() }
        let address = hosts.serverAddress(0)
        #expect(try Self.reaches(hosts, 0, address, port: server?.port))
        try hosts.cutLink(0)
        #expect(try !Self.reaches(hosts, 0, address, port: server?.port))
        try hosts.restoreLink(0)
        #expect(try eventually(timeout: 10) { try Self.reaches(hosts, 0, address, port: server?.port) })
        hosts.close()
        #expect(!FileManager.default.fileExists(atPath: "/run/netns/" + hosts.namespace(1)))
    }

    /// Whether host `i` reaches `address`: one ping, or a TCP connection to `port` within 3 s.
    static func reaches(_ hosts: NetworkHosts, _ i: Int, _ address: String, port: Int?) throws -> Bool {
        let probe =
            if let ping { [ping, "-c", "1", "-W", "2", address] } else {
                ["timeout", "3", "bash", "-c", "echo > /dev/tcp/\(address)/\(port ?? 5432)"]
            }
        let child = try ChildProcess(
            executable: "/usr/bin/env",
            arguments: hosts.command(i, probe),
            onErrorLine: { _ in },
            onLine: { _ in }
        )
        return child.wait(timeout: 10, thenSignal: SIGKILL) == 0
    }
}
