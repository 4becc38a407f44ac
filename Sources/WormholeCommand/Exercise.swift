import ArgumentParser
import Foundation
import WormholeKit

/// Workloads that the package's tests run in child processes; hidden from help.
struct Exercise: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exercise", abstract: "Run a workload for the package's tests.", shouldDisplay: false)

    enum Workload: String, ExpressibleByArgument {
        /// Pass the integers 1...count to one identifier as fast as possible.
        case rapidSend = "rapid-send"
        /// Repeat count times: pass "a", pass "b", clear all (with --coordinated, one step for other readers).
        case passThenClear = "pass-then-clear"
        /// Pass count messages {"writer": tag, "index": i} to one identifier.
        case write
    }

    @Argument var workload: Workload
    @Option var count = 1000
    @Option var identifier = "counter"
    @Option var tag = "w"
    @OptionGroup var location: LocationOptions

    func run() throws {
        let wormhole = try location.makeWormhole()
        switch workload {
        case .rapidSend:
            for number in 1...count { try wormhole.passMessageObject(number, identifier: identifier) }
        case .passThenClear:
            for round in 1...count {
                try wormhole.passMessageObject(round, identifier: "a")
                try wormhole.passMessageObject(round, identifier: "b")
                try wormhole.clearAllMessageContents()
            }
        case .write:
            for index in 0..<count {
                try wormhole.passMessageObject(["writer": tag, "index": String(index)], identifier: identifier)
            }
        }
    }
}
