import Foundation
import Testing
import WormholeCLI
import WormholeKit
import WormholePostgres

/// A live endpoint counts while its process's listening session holds its advisory lock: a process killed with
/// SIGKILL drops its connection, the server ends its session, and senders find nobody within seconds.
@Suite(
    "PostgreSQL engine: live endpoints of processes killed",
    .enabled(if: LocalPostgresServer.unavailableReason() == nil, "PostgreSQL is not installed"),
    .limit(minutes: 2)
)
struct PostgresLivenessTests {
    @Test("A listener and a responder killed with SIGKILL are notReachable within seconds, and their rows are swept")
    func killedEndpoints() async throws { try await offThePool { try killedEndpointsBody() } }

    func killedEndpointsBody() throws {
        let url = try requireTestServerURL()
        let group = uniqueGroup("liveness")
        let location = ["--postgres", url, "--group", group]
        let engine = try PostgresEngine(url: url, group: group)
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine, sender: "sender")

        let listener = try RunningTool(["live-listen", "ping"] + location)
        #expect(listener.waitForError(containing: "listening to ping"))
        let responder = try RunningTool(["respond", "echo", "--exec", "cat"] + location)
        #expect(responder.waitForError(containing: "responding to echo"))
        #expect(try wormhole.sendMessage(1, identifier: "ping") == 1)
        let echoed = try WormholeTool.run(["request", "echo", "7"] + location)
        #expect(echoed.status == 0 && echoed.lines == ["7"], "\(echoed.error)")

        listener.kill()
        responder.kill()
        _ = listener.finish(timeout: 10)
        _ = responder.finish(timeout: 10)
        // The server notices a closed connection at once on one host; a cut link takes its keep-alives' seconds.
        #expect(
            eventually(timeout: 10) {
                (try? wormhole.sendMessage(2, identifier: "ping")) == nil
            },
            "a killed listener stops counting"
        )
        let error = wormholeError { _ = try wormhole.sendMessage(3, identifier: "ping") }
        #expect(error?.code == .notReachable)
        let administration = try PostgresAdministration(url: url)
        defer { administration.close() }
        func endpoints() throws -> [PostgresStatus.Endpoint] {
            try administration.status(group: group).groups.first { $0.name == group }?.liveEndpoints ?? []
        }
        let left = try endpoints()
        #expect(
            left.count == 2 && left.allSatisfy { !$0.isAlive },
            "their rows stay until swept, counted dead: \(left)"
        )

        // A request starts this process's listening connection, which sweeps the rows of those gone.
        let refused = try WormholeTool.run(["request", "echo", "8", "--timeout", "30"] + location)
        #expect(refused.status == 1)
        #expect(refused.error.contains("No process answers"), "\(refused.error)")
        #expect(try endpoints().isEmpty)
        let newcomer = try wormhole.listenForLiveMessages(withIdentifier: "other", as: Int.self) { _ in }
        defer { newcomer.cancel() }
        let after = try endpoints()
        #expect(after.map(\.identifier) == ["other"] && after.allSatisfy(\.isAlive), "\(after)")
    }
}
