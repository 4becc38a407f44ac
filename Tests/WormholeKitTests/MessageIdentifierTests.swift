import Testing
@testable import WormholeKit

@Suite("Message identifiers")
struct MessageIdentifierTests {
    @Test(
        "Identifiers that could escape the directory or hide a control character are refused",
        arguments: [
            "", ".", "..", "../x", "a/b", "/etc/passwd", ".hidden", "nul\u{0}byte", "line\nbreak", "tab\tbed",
            "bell\u{7}", "del\u{7F}", "c1\u{85}", String(repeating: "x", count: 201), String(repeating: "é", count: 101),
            String(repeating: "a", count: 10_000),
        ])
    func refused(_ identifier: String) {
        #expect(!MessageIdentifier.isValid(identifier))
        #expect(throws: WormholeError.self) { try MessageIdentifier.validate(identifier) }
        do {
            try MessageIdentifier.validate(identifier)
        } catch {
            #expect(error.code == .invalidIdentifier)
            #expect(error.identifier == identifier)
            #expect(!error.message.isEmpty)
        }
    }

    @Test(
        "Ordinary names, Unicode and look-alikes of separators are accepted",
        arguments: [
            "button", "com.example.tap", "a..b", "with space", "émoji-🚀", "division∕slash", "fullwidth／slash",
            String(repeating: "x", count: 200),
        ])
    func accepted(_ identifier: String) throws {
        try MessageIdentifier.validate(identifier)
    }
}
