import Foundation

/// Any JSON value: for messages whose shape is not known in advance, or that other languages write.
///
/// ```swift
/// let message: JSONValue = ["kind": "tap", "count": 3, "at": [1.5, 2.5], "note": nil]
/// try wormhole.passMessageObject(message, identifier: "button")
///
/// if let received = try wormhole.message(withIdentifier: "button", as: JSONValue.self),
///     received["kind"]?.stringValue == "tap" {
///     print(received["count"]?.intValue ?? 0, received)   // 3 {"at":[1.5,2.5],"count":3,"kind":"tap","note":null}
/// }
/// ```
///
/// It passes through mailboxes, queues and suites like any `Codable` message, and is decoded from any JSON.
///
/// **Numbers.** A number is an ``integer(_:)`` when it has no fraction and fits in an `Int64`, so that ids and
/// nanosecond timestamps above 2^53 keep every digit, which a `Double` would not; any other number is a
/// ``double(_:)``. Numbers compare by value: `.integer(3) == .double(3)`, as JSON does not tell `3` from `3.0`
/// (a ``double(_:)`` with no fraction encodes as `3` and decodes as an ``integer(_:)``). An integer beyond `Int64`
/// decodes as the nearest `Double`.
public enum JSONValue: Sendable {
    /// `null`.
    case null
    /// `true` or `false`.
    case bool(Bool)
    /// A number with no fraction that fits in an `Int64`, kept exactly.
    case integer(Int64)
    /// Any other number. JSON has no NaN nor infinity: encoding one fails, and ``description`` writes `null`.
    case double(Double)
    /// A string.
    case string(String)
    /// An array.
    case array([JSONValue])
    /// An object; JSON leaves its keys' order open, and ``description`` sorts them.
    case object([String: JSONValue])
}

// MARK: - Reading

extension JSONValue {
    /// The value of `key` in an object; nil when the key is absent or this is not an object.
    public subscript(key: String) -> JSONValue? {
        if case .object(let object) = self { return object[key] }
        return nil
    }

    /// The element at `index` of an array; nil when out of range or this is not an array.
    public subscript(index: Int) -> JSONValue? {
        guard case .array(let array) = self, array.indices.contains(index) else { return nil }
        return array[index]
    }

    /// The string, or nil when this is not a string.
    public var stringValue: String? {
        if case .string(let string) = self { return string }
        return nil
    }

    /// The number as an `Int` when it is one exactly (`3` and `3.0`, not `3.5`); otherwise nil.
    public var intValue: Int? {
        switch self {
        case .integer(let integer): Int(exactly: integer)
        case .double(let double): Int(exactly: double)
        default: nil
        }
    }

    /// The number as a `Double` (an integer beyond 2^53 rounded to the nearest); nil when this is not a number.
    public var doubleValue: Double? {
        switch self {
        case .integer(let integer): Double(integer)
        case .double(let double): double
        default: nil
        }
    }

    /// The Boolean, or nil when this is not `true` or `false` (numbers and strings are not Booleans).
    public var boolValue: Bool? {
        if case .bool(let bool) = self { return bool }
        return nil
    }

    /// The elements, or nil when this is not an array.
    public var arrayValue: [JSONValue]? {
        if case .array(let array) = self { return array }
        return nil
    }

    /// The keys and values, or nil when this is not an object.
    public var objectValue: [String: JSONValue]? {
        if case .object(let object) = self { return object }
        return nil
    }

    /// Whether this is `null`.
    public var isNull: Bool {
        if case .null = self { return true }
        return false
    }
}

// MARK: - Converting

extension JSONValue {
    /// The JSON of any `Encodable` value, as ``JSONMessageCoder`` writes it (ISO 8601 dates, Base64 data).
    ///
    /// - Throws: ``WormholeError/Code/encodingFailed`` when the value cannot be encoded as JSON.
    public init(encoding value: some Encodable) throws(WormholeError) {
        let coder = JSONMessageCoder()
        do {
            self = try coder.decode(JSONValue.self, from: try coder.encode(value))
        } catch {
            throw WormholeError(
                .encodingFailed,
                "The value of type \(type(of: value)) could not be encoded as JSON: \(error).",
                underlyingError: error
            )
        }
    }

    /// This value decoded as `type`, as ``JSONMessageCoder`` reads a message.
    ///
    /// - Throws: ``WormholeError/Code/decodingFailed`` when it is not a `type`.
    public func decoded<Value: Decodable>(as type: Value.Type = Value.self) throws(WormholeError) -> Value {
        let coder = JSONMessageCoder()
        do {
            return try coder.decode(type, from: try coder.encode(self))
        } catch {
            throw WormholeError(
                .decodingFailed,
                "The JSON value \(self) could not be decoded as \(Value.self): \(error).",
                underlyingError: error
            )
        }
    }
}

// MARK: - Codable

extension JSONValue: Codable {
    /// Decodes any JSON value.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let bool = try? container.decode(Bool.self) {
            self = .bool(bool)
        } else if let integer = try? container.decode(Int64.self) {
            // Tried before Double, which would round an integer beyond 2^53.
            self = .integer(integer)
        } else if let double = try? container.decode(Double.self) {
            self = .double(double)
        } else if let string = try? container.decode(String.self) {
            self = .string(string)
        } else if let array = try? container.decode([JSONValue].self) {
            self = .array(array)
        } else if let object = try? container.decode([String: JSONValue].self) {
            self = .object(object)
        } else {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "Not a JSON value.")
        }
    }

    /// Encodes the value as JSON.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let bool): try container.encode(bool)
        case .integer(let integer): try container.encode(integer)
        case .double(let double): try container.encode(double)
        case .string(let string): try container.encode(string)
        case .array(let array): try container.encode(array)
        case .object(let object): try container.encode(object)
        }
    }
}

// MARK: - Equality

extension JSONValue: Hashable {
    /// Whether two values are the same JSON: numbers compare by value, whether integer or double.
    public static func == (lhs: JSONValue, rhs: JSONValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.bool(let a), .bool(let b)): a == b
        case (.integer(let a), .integer(let b)): a == b
        case (.double(let a), .double(let b)): a == b
        // Exactly, with no rounding: 2^53 + 1 is not 2^53 as a Double.
        case (.integer(let a), .double(let b)), (.double(let b), .integer(let a)): Int64(exactly: b) == a
        case (.string(let a), .string(let b)): a == b
        case (.array(let a), .array(let b)): a == b
        case (.object(let a), .object(let b)): a == b
        default: false
        }
    }

    /// Hashes the value; a double with no fraction that fits in an `Int64` hashes as that integer, as it is equal.
    public func hash(into hasher: inout Hasher) {
        switch self {
        case .null:
            hasher.combine(0)
        case .bool(let bool):
            hasher.combine(1)
            hasher.combine(bool)
        case .integer(let integer):
            hasher.combine(2)
            hasher.combine(integer)
        case .double(let double):
            if let integer = Int64(exactly: double) {
                hasher.combine(2)
                hasher.combine(integer)
            } else {
                hasher.combine(3)
                hasher.combine(double)
            }
        case .string(let string):
            hasher.combine(4)
            hasher.combine(string)
        case .array(let array):
            hasher.combine(5)
            hasher.combine(array)
        case .object(let object):
            hasher.combine(6)
            hasher.combine(object)
        }
    }
}

// MARK: - Literals

extension JSONValue: ExpressibleByNilLiteral {
    /// `null`.
    public init(nilLiteral: ()) { self = .null }
}

extension JSONValue: ExpressibleByBooleanLiteral {
    /// A Boolean.
    public init(booleanLiteral value: Bool) { self = .bool(value) }
}

extension JSONValue: ExpressibleByIntegerLiteral {
    /// An integer.
    public init(integerLiteral value: Int64) { self = .integer(value) }
}

extension JSONValue: ExpressibleByFloatLiteral {
    /// A double.
    public init(floatLiteral value: Double) { self = .double(value) }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByStringInterpolation {
    /// A string.
    public init(stringLiteral value: String) { self = .string(value) }
}

extension JSONValue: ExpressibleByArrayLiteral {
    /// An array.
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
}

extension JSONValue: ExpressibleByDictionaryLiteral {
    /// An object; of a key written twice, the last value is kept.
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self = .object(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
}

// MARK: - Text

extension JSONValue: CustomStringConvertible {
    /// Compact JSON, keys sorted: `{"count":3,"kind":"tap"}`. A NaN or an infinity, which JSON cannot hold, is
    /// written `null`.
    public var description: String {
        var text = ""
        write(to: &text)
        return text
    }

    private func write(to text: inout String) {
        switch self {
        case .null:
            text += "null"
        case .bool(let bool):
            text += bool ? "true" : "false"
        case .integer(let integer):
            text += String(integer)
        case .double(let double):
            // Swift's shortest form that reads back as the same Double ("0.1", "1e-07", "3.0") is valid JSON.
            text += double.isFinite ? String(double) : "null"
        case .string(let string):
            Self.writeString(string, to: &text)
        case .array(let array):
            text += "["
            for (index, element) in array.enumerated() {
                if index > 0 { text += "," }
                element.write(to: &text)
            }
            text += "]"
        case .object(let object):
            text += "{"
            for (index, (key, value)) in object.sorted(by: { $0.key < $1.key }).enumerated() {
                if index > 0 { text += "," }
                Self.writeString(key, to: &text)
                text += ":"
                value.write(to: &text)
            }
            text += "}"
        }
    }

    private static func writeString(_ string: String, to text: inout String) {
        text += "\""
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": text += "\\\""
            case "\\": text += "\\\\"
            case "\n": text += "\\n"
            case "\r": text += "\\r"
            case "\t": text += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                text += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: text.unicodeScalars.append(scalar)
            }
        }
        text += "\""
    }
}
