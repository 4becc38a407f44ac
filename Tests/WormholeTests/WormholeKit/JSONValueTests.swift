import Foundation
import Testing
import WormholeKit

/// Any JSON value: literals, accessors, exact integers, and passage through real mailboxes, queues and suites.
@Suite("JSON values", .limit(minutes: 3))
struct JSONValueTests {
    let directory = TemporaryDirectory()

    /// A value of every kind, nested.
    static let sample: JSONValue = [
        "kind": "tap", "count": 3, "ratio": 0.25, "ok": true, "none": nil,
        "big": 9_007_199_254_740_993,  // 2^53 + 1: no Double holds it
        "nested": ["list": [1, "two", [3.5], ["deep": false]], "empty": [], "nothing": [:]],
        "text": "quote \" backslash \\ newline \n tab \t bell \u{7} é 🚀 /",
    ]

    func roundTrip(_ value: JSONValue) throws -> JSONValue {
        try JSONDecoder().decode(JSONValue.self, from: JSONEncoder().encode(value))
    }

    @Test("Literals make the cases they say")
    func literals() {
        let value: JSONValue = ["a": 1, "b": 1.5, "c": "x", "d": true, "e": nil, "f": [1, 2]]
        #expect(
            value
                == .object([
                    "a": .integer(1), "b": .double(1.5), "c": .string("x"), "d": .bool(true), "e": .null,
                    "f": .array([.integer(1), .integer(2)]),
                ])
        )
        let count = 4
        let interpolated: JSONValue = "count \(count)"
        #expect(interpolated == .string("count 4"))
        let repeated: JSONValue = ["k": 1, "k": 2]
        #expect(repeated == ["k": 2])
    }

    @Test("Accessors read each kind, and nil for another kind, a missing key or an index out of range")
    func accessors() {
        let value = Self.sample
        #expect(value["kind"]?.stringValue == "tap")
        #expect(value["count"]?.intValue == 3)
        #expect(value["count"]?.doubleValue == 3)
        #expect(value["ratio"]?.doubleValue == 0.25)
        #expect(value["ratio"]?.intValue == nil)
        #expect(JSONValue.double(4).intValue == 4)
        #expect(value["ok"]?.boolValue == true)
        #expect(value["count"]?.boolValue == nil)
        #expect(value["none"]?.isNull == true)
        #expect(value["missing"] == nil)
        #expect(value["nested"]?["list"]?[1]?.stringValue == "two")
        #expect(value["nested"]?["list"]?[3]?["deep"]?.boolValue == false)
        #expect(value["nested"]?["list"]?[4] == nil)
        #expect(value["nested"]?["list"]?[-1] == nil)
        #expect(value["nested"]?["empty"]?.arrayValue == [])
        #expect(value["nested"]?["nothing"]?.objectValue == [:])
        #expect(value[0] == nil)
        #expect(value.objectValue?.count == 8)
        #expect(value["kind"]?["x"] == nil)
        #expect(!value.isNull)
    }

    @Test(
        "Round trips through JSONEncoder and JSONDecoder keep every value, nested",
        arguments: [
            sample, nil, true, false, 0, -1, 1.5, -0.0, 1e300, "", "text", [], [:], [[[[]]]],
            .integer(.max), .integer(.min), .double(0.1), .double(1e-7), .double(.leastNonzeroMagnitude),
        ] as [JSONValue]
    )
    func roundTrips(_ value: JSONValue) throws {
        #expect(try roundTrip(value) == value)
        // Its description is JSON that decodes to it too.
        #expect(try JSONDecoder().decode(JSONValue.self, from: Data(value.description.utf8)) == value)
    }

    @Test("Integers beyond 2^53 keep every digit; numbers compare by value")
    func exactIntegers() throws {
        let big: JSONValue = 9_007_199_254_740_993
        #expect(try roundTrip(big) == .integer(9_007_199_254_740_993))
        #expect(try JSONDecoder().decode(JSONValue.self, from: Data("9007199254740993".utf8)) == big)
        #expect(
            try JSONDecoder().decode(JSONValue.self, from: Data("1700000000123456789".utf8)).intValue
                == 1_700_000_000_123_456_789
        )
        #expect(String(decoding: try JSONEncoder().encode(big), as: UTF8.self) == "9007199254740993")
        // A Double cannot tell 2^53 + 1 from 2^53; an integer can.
        #expect(big != .double(9_007_199_254_740_992))
        #expect(JSONValue.integer(3) == .double(3))
        #expect(Set<JSONValue>([.integer(3), .double(3), .double(3.5)]).count == 2)
        #expect(try JSONDecoder().decode(JSONValue.self, from: Data("[3.0, 3.5, -2]".utf8)) == [3, 3.5, -2])
        // Beyond Int64: the nearest Double.
        #expect(
            try JSONDecoder().decode(JSONValue.self, from: Data("18446744073709551615".utf8)).doubleValue
                == 18_446_744_073_709_551_615.0
        )
    }

    @Test("The description is compact JSON with sorted keys and escaped strings")
    func description() {
        let value: JSONValue = ["kind": "tap", "count": 3, "list": [1.5, nil, true], "s": "a\"b\\c\nd\u{1}/"]
        #expect(value.description == #"{"count":3,"kind":"tap","list":[1.5,null,true],"s":"a\"b\\c\nd\u0001/"}"#)
        #expect(JSONValue.double(.nan).description == "null")
        #expect(JSONValue.double(3).description == "3.0")
    }

    @Test("Any Encodable converts to a JSON value and back")
    func conversion() throws {
        let date = Date(timeIntervalSince1970: 1_700_000_000)
        let value = try JSONValue(encoding: ["at": date])
        #expect(value["at"]?.stringValue == "2023-11-14T22:13:20Z")
        #expect(try value.decoded(as: [String: Date].self) == ["at": date])
        #expect(try JSONValue(encoding: Tap(number: 2)) == ["number": 2])
        let error = #expect(throws: WormholeError.self) { try JSONValue.string("x").decoded(as: Tap.self) }
        #expect(error?.code == .decodingFailed)
        #expect(throws: WormholeError.self) { try JSONValue(encoding: Double.infinity) }
    }

    @Test("The example of the documentation compiles and runs")
    func documentationExample() throws {
        let wormhole = try Wormhole(directory: directory("wormhole"))
        let message: JSONValue = ["kind": "tap", "count": 3, "at": [1.5, 2.5], "note": nil]
        try wormhole.passMessageObject(message, identifier: "button")
        if let received = try wormhole.message(withIdentifier: "button", as: JSONValue.self),
            received["kind"]?.stringValue == "tap"
        {
            #expect(received["count"]?.intValue == 3)
            #expect(received.description == #"{"at":[1.5,2.5],"count":3,"kind":"tap","note":null}"#)
        } else {
            Issue.record("the message did not come back")
        }
        // The README's.
        try wormhole.passMessageObject(["kind": "tap", "count": 3] as JSONValue, identifier: "event")
        let event = try wormhole.message(withIdentifier: "event", as: JSONValue.self)
        #expect(event?["count"]?.intValue == 3)
        #expect(event?.description == #"{"count":3,"kind":"tap"}"#)
    }

    @Test("A JSON value passes through a mailbox, to a listener, a queue and a suite of a real directory")
    func throughAWormhole() throws {
        let wormhole = try Wormhole(directory: directory("wormhole"))
        // The mailbox, read and listened to.
        let heard = Collector<JSONValue>()
        let listener = try wormhole.listenForMessage(withIdentifier: "any", as: JSONValue.self, on: .notifierThread) {
            heard.append($0)
        }
        try wormhole.passMessageObject(Self.sample, identifier: "any")
        #expect(try wormhole.message(withIdentifier: "any", as: JSONValue.self) == Self.sample)
        #expect(eventually(timeout: 5) { heard.values == [Self.sample] })
        listener.cancel()
        // Another type reads the same bytes.
        try wormhole.passMessageObject(["number": 5] as JSONValue, identifier: "tap")
        #expect(try wormhole.message(withIdentifier: "tap", as: Tap.self) == Tap(number: 5))
        // The queue.
        let queue = try wormhole.queue("values")
        let received = Collector<JSONValue>()
        let consumer = try queue.consume(consumer: "c", as: JSONValue.self, on: .notifierThread) {
            received.append($0.value)
        }
        try queue.enqueue(Self.sample)
        try queue.enqueue(JSONValue.null)
        try queue.enqueue(["b", 2] as JSONValue)
        #expect(eventually(timeout: 5) { received.values == [Self.sample, nil, ["b", 2]] })
        consumer.cancel()
        // The suite, whose file keeps its values through JSONSerialization.
        let suite = try wormhole.suite("settings")
        try suite.set(Self.sample, forKey: "sample")
        try suite.set(JSONValue.integer(.max), forKey: "max")
        #expect(try suite.value(forKey: "sample", as: JSONValue.self) == Self.sample)
        #expect(try suite.value(forKey: "max", as: JSONValue.self) == .integer(.max))
        #expect(try suite.snapshot()["sample", as: JSONValue.self]?["big"] == .integer(9_007_199_254_740_993))
    }
}
