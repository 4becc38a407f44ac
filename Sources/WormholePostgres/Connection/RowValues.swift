import WormholeKit

/// Numbers read from the server's rows, checked before they are used.
///
/// Any member of a group may write any row of it, by hand as well as through this package, so a row is another
/// process's word, as a file in a shared directory is: a value no writer of this package writes (a negative
/// sequence, an offset at the end of `bigint`'s range) is refused with a typed error that names the table and the row,
/// never converted with a trap. The process goes on serving everything else.
enum RowValues {
    /// `value` as a position, sequence number, version or size: 0 through `Int64.max - 1`, so that one past it is
    /// still a `bigint` the server can be sent back.
    ///
    /// - Parameters:
    ///   - column: The column it came from.
    ///   - table: The table, without the schema (`mailboxes`).
    ///   - row: What names the row, for the message (`the mailbox box of group g`).
    ///   - identifier: The identifier the error carries, if any.
    static func count(
        _ value: Int64,
        _ column: String,
        of table: String,
        row: String,
        identifier: String? = nil
    ) throws(WormholeError) -> UInt64 {
        guard value >= 0, value < Int64.max else {
            throw corrupt("\(column) = \(value)", of: table, row: row, identifier: identifier)
        }
        return UInt64(value)
    }

    /// The error for a row whose values no writer of this package writes.
    static func corrupt(
        _ what: String,
        of table: String,
        row: String,
        identifier: String? = nil
    ) -> WormholeError {
        WormholeError(
            .corruptMessage,
            "The row of wormhole.\(table) for \(row) holds \(what), which this package never writes: the row was "
                + "changed by hand or by another program with the group's rights. It is not used; fix or remove it.",
            identifier: identifier
        )
    }

    /// `value` as the `bigint` it is sent as; a number past `Int64.max` (which no checked row gives) is refused.
    static func bigint(_ value: UInt64, _ what: String, identifier: String? = nil) throws(WormholeError) -> Int64 {
        guard let converted = Int64(exactly: value) else {
            throw WormholeError(
                .corruptMessage,
                "\(what) is \(value), past what PostgreSQL's bigint holds: it did not come from this engine.",
                identifier: identifier
            )
        }
        return converted
    }
}
