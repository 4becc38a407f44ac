import Foundation
import Testing

@testable import WormholeKit

/// The primary keys a history row holds, read the fast way, as their `Decodable` form reads them.
@Suite("Primary keys of history rows")
struct PrimaryKeyTests {
    @Test(
        "PrimaryKey(historyJSON:) reads every key as JSONDecoder does, and refuses what it refuses",
        arguments: [
            #"{"id":1}"#, #"{"id":-42}"#, #"{"a":"x","b":2.5}"#, #"{"n":null}"#, #"{"r":1.0}"#, #"{"r":1e3}"#,
            #"{"big":9223372036854775807}"#, #"{"huge":18446744073709551616}"#, #"{"s":"é \"quoted\" \\ /"}"#,
            #"{"blob":"00FF"}"#, #"{}"#, #"[1]"#, #"{"a":[1]}"#, #"{"a":{"b":1}}"#, #"{"a":true}"#, "not json",
            #"{"id":1"#, #"{"id": 1}"#, #"{"a": 1, "b": "x", "c": null}"#, #"{"id":01}"#, #"{"id":-0}"#,
            #"{"id":-9223372036854775808}"#, #"{"id":9223372036854775808}"#, #"{"id":-9223372036854775809}"#,
            #"{"id":1}x"#, #"{"id":-}"#, #"{"id":1.5}"#, #"{"id":2E2}"#, #"{"t":"plain text, with: {}"}"#,
            #"{"t":"tab\tescaped"}"#, #"{"t":"é"}"#, #"{"n":nul}"#, #"{"n":nullx}"#, #"{"a":1,}"#, #"{,}"#, "{",
            #"{ }"#, #"{"a":1 , "b":2}"#, "{\"ctl\":\"a\u{01}b\"}", #"{"id":1,"id":2}"#, #"{"id":null,"id":"x"}"#,
            "{\"huge\":1" + String(repeating: "0", count: 400) + "}",
        ]
    )
    func readsAsDecodable(text: String) throws {
        let decoded = try? JSONDecoder().decode([String: PrimaryKeyValue].self, from: Data(text.utf8))
        #expect(PrimaryKey(historyJSON: text) == decoded.map(PrimaryKey.init))
    }
}
