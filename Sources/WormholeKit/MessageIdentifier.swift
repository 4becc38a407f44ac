/// The rules a message identifier must follow, so that it can never name a file outside the wormhole directory.
///
/// Identifiers are **validated, not encoded**: a bad identifier is refused with
/// ``WormholeError/Code/invalidIdentifier`` instead of being rewritten, so the file on disk always has the name
/// the user gave it and two identifiers can never collide after encoding. An identifier is valid when it:
/// - is 1 to ``maximumLength`` bytes of UTF-8,
/// - does not start with `.` (which also rules out `.` and `..`; names that start with a dot are reserved for the
///   wormhole's own files),
/// - holds no `/`, no NUL and no control character (U+0000–U+001F, U+007F–U+009F).
///
/// Any other Unicode is allowed. Look-alikes such as U+2215 DIVISION SLASH are ordinary characters to the file
/// system and cannot escape the directory.
public enum MessageIdentifier: Sendable {
    /// The longest identifier, in bytes of UTF-8; file names have 255 bytes on Linux, and the wormhole adds a suffix.
    public static let maximumLength = 200

    /// The longest notification name, in bytes of UTF-8: a file name on Linux (`NAME_MAX`).
    ///
    /// A notification name is an identifier with a prefix (`mailbox.`, `queue.`, `suite.`, `store.`), so it may be
    /// longer than ``maximumLength``; otherwise it follows the identifier rules.
    public static let maximumNotificationNameLength = 255

    /// Checks an identifier and throws ``WormholeError/Code/invalidIdentifier`` saying what is wrong with it.
    public static func validate(_ identifier: String) throws(WormholeError) {
        if let problem = problem(with: identifier, limit: maximumLength) {
            throw WormholeError(
                .invalidIdentifier,
                "The identifier \(describe(identifier)) is not valid: \(problem).",
                identifier: identifier
            )
        }
    }

    /// Whether an identifier follows the rules.
    public static func isValid(_ identifier: String) -> Bool { problem(with: identifier, limit: maximumLength) == nil }

    /// Checks a notification name: the identifier rules, with ``maximumNotificationNameLength`` as the limit, so that
    /// every valid identifier with its prefix is a valid name. Throws ``WormholeError/Code/invalidIdentifier``.
    public static func validateNotificationName(_ name: String) throws(WormholeError) {
        if let problem = problem(with: name, limit: maximumNotificationNameLength) {
            throw WormholeError(
                .invalidIdentifier,
                "The notification name \(describe(name)) is not valid: \(problem).",
                identifier: name
            )
        }
    }

    private static func problem(with identifier: String, limit: Int) -> String? {
        let length = identifier.utf8.count
        if length == 0 { return "it is empty" }
        if length > limit { return "it is \(length) bytes long, and the limit is \(limit)" }
        // The first byte, not the first character: a '.' followed by a combining mark is one character, yet its file
        // name still starts with '.'.
        if identifier.utf8.first == UInt8(ascii: ".") {
            return "it starts with '.', which is reserved for the wormhole's own files"
        }
        // Printable ASCII with no '/', as nearly every identifier is: checked on its bytes, with no decoding (every
        // pass and every read checks its identifier).
        let printableASCII = identifier.utf8.withContiguousStorageIfAvailable { bytes in
            bytes.allSatisfy { $0 >= 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "/") }
        }
        if printableASCII == true { return nil }
        for scalar in identifier.unicodeScalars {
            if scalar == "/" { return "it contains '/', which would name another directory" }
            if scalar.value == 0 { return "it contains a NUL character" }
            if scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) {
                return "it contains the control character U+\(String(scalar.value, radix: 16, uppercase: true))"
            }
        }
        return nil
    }

    /// A short, printable rendering of a possibly hostile identifier for error messages.
    private static func describe(_ identifier: String) -> String {
        let escaped = identifier.unicodeScalars.prefix(64).map { scalar in
            scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value)
                ? "\\u{\(String(scalar.value, radix: 16))}" : String(scalar)
        }.joined()
        return "\"\(escaped)\(identifier.unicodeScalars.count > 64 ? "…" : "")\""
    }
}
