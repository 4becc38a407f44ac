import ArgumentParser
import Foundation
import WormholeCLI

/// `WormholeHarness`: what the tests, `scripts/crash-test` and the benchmarks run, kept out of the shipped tool.
///
/// No product names this target: `swift build` builds it beside the tool, and `swift run WormholeHarness` runs it.
@main
struct WormholeHarness: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "WormholeHarness",
        abstract: "The wormhole's test and benchmark harness: crash tests, load exercises, benchmarks.",
        discussion: """
            Not for users: the tests, scripts/crash-test and Benchmarks/ run these commands. \
            `swift run -c release WormholeHarness bench mailbox|queue|store|suite` prints figures for this machine.
            """,
        subcommands: [
            Bench.self, BenchCase.self, CrashTest.self, Exercise.self, ExerciseStore.self, ExercisePostgresStore.self,
            PostgresStoreBench.self,
            CrashVictim.self, BenchPeer.self, BenchPeerStore.self, BenchCasePeer.self, PostgresServerCommand.self,
            PostgresBenchCase.self, PostgresBenchCasePeer.self, PowerLoss.self, PowerWorkload.self, StoppedHolder.self,
            SuspensionCheck.self,
        ]
    )
}

extension WormholeHarness {
    /// Runs it; see ``ParsableCommand/mainIgnoringBrokenPipes()``.
    static func main() { mainIgnoringBrokenPipes() }
}
