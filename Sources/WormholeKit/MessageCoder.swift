import Foundation

/// Turns messages into bytes and back.
///
/// The default, ``JSONMessageCoder``, makes messages readable from the command line (`wormhole read`) and from
/// any language. There is no archiving of arbitrary object graphs: a coder only ever produces the type asked for.
public protocol MessageCoder: Sendable {
    /// Encodes a message.
    func encode<Message: Encodable>(_ message: Message) throws -> Data
    /// Decodes a message of the given type.
    func decode<Message: Decodable>(_ type: Message.Type, from data: Data) throws -> Message
}

extension MessageCoder {
    /// Encodes a message, turning any failure into ``WormholeError/Code/encodingFailed`` for `identifier`.
    func encodeMessage<Message: Encodable>(_ message: Message, identifier: String) throws(WormholeError) -> Data {
        do {
            return try encode(message)
        } catch {
            throw WormholeError(
                .encodingFailed,
                "The message of type \(Message.self) could not be encoded: \(error).",
                identifier: identifier,
                underlyingError: error
            )
        }
    }
}

/// Encodes messages as JSON (the default).
///
/// Dates are written as ISO 8601 strings and data as Base64, so that a message reads the same in every language.
public struct JSONMessageCoder: MessageCoder {
    /// Creates a JSON coder.
    public init() {}

    public func encode<Message: Encodable>(_ message: Message) throws -> Data {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(message)
    }

    public func decode<Message: Decodable>(_ type: Message.Type, from data: Data) throws -> Message {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return try decoder.decode(type, from: data)
    }
}

/// Encodes messages as binary property lists, for callers who prefer them; decoding checks the type as JSON does.
public struct PropertyListMessageCoder: MessageCoder {
    /// Creates a property-list coder.
    public init() {}

    public func encode<Message: Encodable>(_ message: Message) throws -> Data {
        let encoder = PropertyListEncoder()
        encoder.outputFormat = .binary
        return try encoder.encode(message)
    }

    public func decode<Message: Decodable>(_ type: Message.Type, from data: Data) throws -> Message {
        try PropertyListDecoder().decode(type, from: data)
    }
}
