import Testing

@testable import WormholeKit

/// An identifier as a test argument, shown short and escaped in the test log.
struct IdentifierCase: CustomTestStringConvertible, Sendable {
    let value: String
    init(_ value: String) { self.value = value }
    var testDescription: String {
        let escaped = value.unicodeScalars.prefix(24).map {
            $0.isASCII && $0.value >= 0x20 ? String($0) : "\\u{\(String($0.value, radix: 16))}"
        }.joined()
        return value.unicodeScalars.count > 24 ? "\(escaped)… (\(value.utf8.count) bytes)" : escaped
    }
}

@Suite("Message identifiers")
struct MessageIdentifierTests {
    @Test(
        "Identifiers that could escape the directory or hide a control character are refused",
        arguments: [
            "", ".", "..", "../x", "a/b", "/etc/passwd", ".hidden", ".\u{301}hidden", "nul\u{0}byte", "line\nbreak",
            "tab\tbed",
            "bell\u{7}", "del\u{7F}", "c1\u{85}", String(repeating: "x", count: 201),
            String(repeating: "é", count: 101),
            String(repeating: "a", count: 10_000),
        ].map(IdentifierCase.init)
    )
    func refused(_ identifierCase: IdentifierCase) async throws {
        try await offThePool {
            let identifier = identifierCase.value
            #expect(!MessageIdentifier.isValid(identifier))
            #expect(throws: WormholeError.self) { try MessageIdentifier.validate(identifier) }
            do throws(WormholeError) {
                try MessageIdentifier.validate(identifier)
            } catch {
                #expect(error.code == .invalidIdentifier)
                #expect(error.identifier == identifier)
                #expect(!error.message.isEmpty)
            }
        }
    }

    @Test(
        "Ordinary names, Unicode and look-alikes of separators are accepted",
        arguments: [
            "button", "com.example.tap", "a..b", "with space", "émoji-🚀", "division∕slash", "fullwidth／slash",
            String(repeating: "x", count: 200),
        ].map(IdentifierCase.init)
    )
    func accepted(_ identifierCase: IdentifierCase) async throws {
        try await offThePool {
            try MessageIdentifier.validate(identifierCase.value)
        }
    }
}
