import Foundation
import Logging
import Synchronization

/// One change to a suite, as an observer receives it.
public struct SuiteChange: Sendable, Equatable {
    /// The suite's version after the change.
    public var version: UInt64
    /// The keys it changed (among those observed).
    public var keys: Set<String>
    /// Who made it (empty when unknown: more changes came at once than the suite's log keeps).
    public var sender: String
    /// The direction it was made with, if any.
    public var direction: String?
    /// When it was made, in nanoseconds since 1970.
    public var timestampNanoseconds: Int64
    /// The values this change set; a removed key is absent.
    public var values: SuiteValues

    /// Creates a change, as an engine's ``SuiteStore`` records it.
    public init(
        version: UInt64,
        keys: Set<String>,
        sender: String,
        direction: String?,
        timestampNanoseconds: Int64,
        values: SuiteValues
    ) {
        self.version = version
        self.keys = keys
        self.sender = sender
        self.direction = direction
        self.timestampNanoseconds = timestampNanoseconds
        self.values = values
    }

    init(entry: SuiteDocument.Entry) {
        self.init(
            version: entry.version,
            keys: Set(entry.keys),
            sender: entry.sender,
            direction: entry.direction,
            timestampNanoseconds: entry.time,
            values: SuiteValues(storage: entry.values)
        )
    }
}
