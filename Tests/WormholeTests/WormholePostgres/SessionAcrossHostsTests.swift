import Foundation
import Testing
import WormholeCLI
import WormholeKit

@Suite(
    "Sessions across hosts: a phone and a watch on two network namespaces, through PostgreSQL",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .serialized
)
struct SessionAcrossHostsTests {
    @Test(
        "Context while away, user info and files across kills and restarts, messages, not reachable",
        .timeLimit(.minutes(5))
    )
    func phoneAndWatch() async throws {
        let fixture = try await HostsFixture.make(hosts: 2)
        try await offThePool {
            try SessionScenario(
                start: { side, arguments in try fixture.run(side, arguments) },
                scratch: fixture.temporary.path
            )
            .play()
        }
    }

    @Test("wormhole demo session makes its hosts and server, plays, and exits 0", .timeLimit(.minutes(3)))
    func demo() async throws {
        if let reason = NetworkHosts.unavailableReason() { try Test.cancel("No network namespaces here: \(reason)") }
        if let reason = LocalPostgresServer.unavailableReason() { try Test.cancel("No PostgreSQL here: \(reason)") }
        try await offThePool {
            let result = try RunningTool(["demo", "session"]).finish(timeout: 150)
            #expect(result.status == 0, "\(result.error)")
            #expect(result.output.contains("two hosts"))
            #expect(result.output.contains("didReceiveApplicationContext"))
            #expect(result.output.contains("didReceive file workout.gpx (4194304 bytes"))
            #expect(result.output.contains("not reachable"))
        }
    }
}
