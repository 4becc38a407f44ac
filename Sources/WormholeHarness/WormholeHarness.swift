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
            `swift run -c release WormholeHarness bench mailbox|queue|store` prints figures for this machine.
            """,
        subcommands: [
            Bench.self, BenchCase.self, CrashTest.self, Exercise.self, ExerciseStore.self,
            CrashVictim.self, BenchPeer.self, BenchPeerStore.self, BenchCasePeer.self,
        ]
    )
}

extension WormholeHarness {
    /// Runs the harness. SIGPIPE is ignored, as in the tool: a write to a closed pipe fails, it does not kill.
    static func main() {
        signal(SIGPIPE, SIG_IGN)
        do {
            var command = try parseAsRoot()
            try command.run()
        } catch {
            exit(withError: error)
        }
    }
}
