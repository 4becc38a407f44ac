import Foundation
import Testing

/// Crash consistency in every mode: `wormhole crash-test` starts writers and consumers (copies of the tool) and
/// kills them with SIGKILL 0–10 ms into their work, checking after each kill and at the end that nothing is torn, lost
/// or delivered twice. The suite runs 25 kills per mode; `scripts/crash-test` runs 1,000 (RELIABILITY.md).
@Suite("Crash consistency", .slow("hundreds of processes killed mid-write"), .limit(minutes: 5))
struct CrashTests {
    let directory = TemporaryDirectory()

    @Test(
        "Writers and consumers killed at random: nothing torn, lost or repeated",
        arguments: ["mailbox", "queue", "queue-retry", "suite", "store"]
    )
    func randomKills(mode: String) async throws {
        // On a thread of its own: the run takes seconds, and waiting for it on the cooperative pool would starve the
        // async tests of other suites (a responder loop, a listening sequence) until they time out.
        try await offThePool { try randomKillsBody(mode: mode) }
    }

    func randomKillsBody(mode: String) throws {
        let result = try WormholeTool.run(
            ["crash-test", mode, "--kills", "25", "--directory", directory(mode)],
            timeout: 240
        )
        #expect(result.status == 0, "\(result.lines) \(result.error)")
        let summary = try #require(result.lines.last)
        #expect(summary.hasPrefix("crash-test \(mode): 25 SIGKILLs, 0 failures"), "\(summary)")
    }
}
