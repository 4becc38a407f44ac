import Foundation
import Testing

/// A contributor's quick run: `WORMHOLE_TEST_QUICK=1 swift test` (or `scripts/test-quick`) leaves out what needs a
/// PostgreSQL server, network namespaces, thousands of kills or long loads, and runs the contract suites against the
/// directory and in-memory engines only. CI runs everything.
enum QuickRun {
    /// Whether this run is a quick one.
    static let isOn = ProcessInfo.processInfo.environment["WORMHOLE_TEST_QUICK"] == "1"
}

extension Trait where Self == ConditionTrait {
    /// Leaves the suite or test out of a quick run (``QuickRun``), saying why.
    static func slow(_ reason: String) -> Self {
        .disabled(if: QuickRun.isOn, Comment(rawValue: "left out of a quick run (WORMHOLE_TEST_QUICK=1): " + reason))
    }
}

extension EngineKind {
    /// The engines the contract suites run against: every one, or in a quick run the two that need no server.
    static var underTest: [EngineKind] {
        QuickRun.isOn ? [.directory, .inMemory] : allCases
    }
}
