import Foundation

/// One committed write transaction of a shared store, as its history recorded it.
///
/// Its ``id`` is the history token: a consumer that has merged this transaction resumes after it.
public struct StoreTransaction: Sendable, Hashable, Codable {
    /// The history token: transactions are numbered in commit order.
    public var id: Int64
    /// Who wrote it: a store's author, or `external` for a write made outside a store (another tool, `psql`).
    public var author: String
    /// When it was committed.
    public var date: Date
    /// The changed rows, by table name.
    public var tables: [String: TableChanges]
    /// History rows of this transaction that could not be read; the other rows are in ``tables``.
    public var damagedChanges: [DamagedChange]

    /// Creates a transaction record.
    public init(
        id: Int64,
        author: String,
        date: Date,
        tables: [String: TableChanges],
        damagedChanges: [DamagedChange] = []
    ) {
        self.id = id
        self.author = author
        self.date = date
        self.tables = tables
        self.damagedChanges = damagedChanges
    }

    /// The names of the tables it changed, sorted.
    public var tableNames: [String] { Array(Set(tables.keys).union(damagedChanges.map(\.table))).sorted() }
}

/// The rows of one table that a transaction inserted, updated and deleted, by primary key.
public struct TableChanges: Sendable, Hashable, Codable {
    /// Inserted rows, in order.
    public var inserted: [PrimaryKey] = []
    /// Updated rows, in order (a row updated twice is listed twice).
    public var updated: [PrimaryKey] = []
    /// Deleted rows, in order.
    public var deleted: [PrimaryKey] = []

    /// Creates a set of changes.
    public init(inserted: [PrimaryKey] = [], updated: [PrimaryKey] = [], deleted: [PrimaryKey] = []) {
        self.inserted = inserted
        self.updated = updated
        self.deleted = deleted
    }
}

/// A row's primary key: its columns and their values (SQLite: `rowid` for tables without a declared primary key;
/// PostgreSQL: no column for a table without a primary key).
public struct PrimaryKey: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The primary key's columns and values.
    public var columns: [String: PrimaryKeyValue]

    /// Creates a primary key.
    public init(_ columns: [String: PrimaryKeyValue]) { self.columns = columns }

    /// The integer value of a single-column integer key (an integer primary key, or SQLite's rowid), if it is one.
    public var integerValue: Int64? {
        guard columns.count == 1, case .integer(let value) = columns.first!.value else { return nil }
        return value
    }

    public var description: String {
        columns.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",")
    }

    public init(from decoder: any Decoder) throws { columns = try [String: PrimaryKeyValue](from: decoder) }
    public func encode(to encoder: any Encoder) throws { try columns.encode(to: encoder) }

    /// A key as a history row holds it: a JSON object of column values (`{"id":1}`); nil when the text is not one.
    ///
    /// Read as ``PrimaryKeyValue``'s `Decodable` form reads it (an integer, else a real, else text, or null), but
    /// faster, since a consumer reads one for every row changed: a plain key (``plainColumns(_:)``) by hand, any other
    /// with `JSONSerialization` (a `JSONDecoder` took about twice as long: 6.6–7.0 µs a one-column key against
    /// 2.7–4.1 µs, on this project's machine).
    package init?(historyJSON text: String) {
        if let columns = Self.plainColumns(text) {
            self.init(columns)
            return
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            return nil
        }
        var columns: [String: PrimaryKeyValue] = [:]
        for (column, value) in object {
            switch value {
            case is NSNull: columns[column] = .null
            case let text as String: columns[column] = .text(text)
            case let number as NSNumber:
                let type = String(cString: number.objCType)
                if type == "d" || type == "f" {
                    let real = number.doubleValue
                    // A whole number written as a real (1.0, 1e3) is an integer, as JSONDecoder reads it.
                    if real.rounded() == real, real >= -0x1p63, real < 0x1p63 {
                        columns[column] = .integer(Int64(real))
                    } else {
                        columns[column] = .real(real)
                    }
                } else if type == "c" || type == "B" {
                    return nil  // true or false: not a value SQLite's json_object writes for a key
                } else if type == "Q", number.uint64Value > UInt64(Int64.max) {
                    columns[column] = .real(number.doubleValue)
                } else {
                    columns[column] = .integer(number.int64Value)
                }
            default: return nil  // an array or an object
            }
        }
        self.init(columns)
    }
}

extension PrimaryKey {
    /// The columns of a key that holds only what the stores' triggers write for most keys, read without
    /// `JSONSerialization` (which took most of a one-row transaction's decoding): an object of integers, texts
    /// without escapes, and nulls, as SQLite's `json_object` writes it (PostgreSQL's `jsonb` puts a space after each
    /// `:` and `,`). Nil for anything else (a real, an escape, text that is not JSON), which the caller reads the
    /// general way.
    package static func plainColumns(_ text: String) -> [String: PrimaryKeyValue]? {
        var text = text
        return text.withUTF8 { bytes -> [String: PrimaryKeyValue]? in
            var index = 0
            func skipSpaces() {
                while index < bytes.count, bytes[index] == UInt8(ascii: " ") { index += 1 }
            }
            func take(_ byte: UInt8) -> Bool {
                guard index < bytes.count, bytes[index] == byte else { return false }
                index += 1
                return true
            }
            // A string without escapes or control characters: its bytes are its text.
            func string() -> String? {
                guard take(UInt8(ascii: "\"")) else { return nil }
                let start = index
                while index < bytes.count, bytes[index] != UInt8(ascii: "\"") {
                    if bytes[index] == UInt8(ascii: "\\") || bytes[index] < 0x20 { return nil }
                    index += 1
                }
                guard index < bytes.count else { return nil }
                let value = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
                index += 1
                return value
            }
            // An integer as JSON writes it (no leading zero, no fraction or exponent); beyond Int64, a real, as
            // `PrimaryKeyValue`'s `Decodable` form reads it.
            func integer() -> PrimaryKeyValue? {
                let start = index
                _ = take(UInt8(ascii: "-"))
                let digitsStart = index
                while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") {
                    index += 1
                }
                let digits = index - digitsStart
                guard digits > 0, digits == 1 || bytes[digitsStart] != UInt8(ascii: "0") else { return nil }
                if index < bytes.count {
                    switch bytes[index] {
                    case UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): return nil  // a real
                    default: break
                    }
                }
                let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
                if let value = Int64(text) { return .integer(value) }
                // Beyond a Double too: not a number JSONDecoder reads.
                guard let real = Double(text), real.isFinite else { return nil }
                return .real(real)
            }
            var columns: [String: PrimaryKeyValue] = [:]
            guard take(UInt8(ascii: "{")) else { return nil }
            skipSpaces()
            if take(UInt8(ascii: "}")) { return index == bytes.count ? columns : nil }
            repeat {
                skipSpaces()
                guard let name = string() else { return nil }
                // A column named twice keeps its first value, as JSONDecoder reads it.
                let repeated = columns[name] != nil
                skipSpaces()
                guard take(UInt8(ascii: ":")) else { return nil }
                skipSpaces()
                guard index < bytes.count else { return nil }
                switch bytes[index] {
                case UInt8(ascii: "\""):
                    guard let value = string() else { return nil }
                    if !repeated { columns[name] = .text(value) }
                case UInt8(ascii: "n"):
                    guard bytes.count - index >= 4, bytes[index + 1] == UInt8(ascii: "u"),
                        bytes[index + 2] == UInt8(ascii: "l"), bytes[index + 3] == UInt8(ascii: "l")
                    else { return nil }
                    index += 4
                    if !repeated { columns[name] = .null }
                default:
                    guard let value = integer() else { return nil }
                    if !repeated { columns[name] = value }
                }
                skipSpaces()
            } while take(UInt8(ascii: ","))
            guard take(UInt8(ascii: "}")), index == bytes.count else { return nil }
            return columns
        }
    }
}

/// A value in a primary key. BLOB values are recorded as their hexadecimal text.
public enum PrimaryKeyValue: Sendable, Hashable, Codable, CustomStringConvertible {
    case integer(Int64)
    case real(Double)
    case text(String)
    case null

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Int64.self) {
            self = .integer(value)
        } else if let value = try? container.decode(Double.self) {
            self = .real(value)
        } else {
            self = .text(try container.decode(String.self))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .integer(let value): try container.encode(value)
        case .real(let value): try container.encode(value)
        case .text(let value): try container.encode(value)
        case .null: try container.encodeNil()
        }
    }

    public var description: String {
        switch self {
        case .integer(let value): "\(value)"
        case .real(let value): "\(value)"
        case .text(let value): value
        case .null: "NULL"
        }
    }
}

/// A history row that could not be read: which one, and why.
public struct DamagedChange: Sendable, Hashable, Codable {
    /// The row's id: in `wormhole_history` (SQLite), or its `seq` in `wormhole.store_changes` (PostgreSQL).
    public var changeID: Int64
    /// The table the row names.
    public var table: String
    /// What is wrong with it.
    public var reason: String

    /// Creates a record of a damaged row.
    public init(changeID: Int64, table: String, reason: String) {
        self.changeID = changeID
        self.table = table
        self.reason = reason
    }
}
