import Foundation
import Testing
import WormholeKit

/// The suite contract, for every engine (``SuiteStore``).
///
/// A suite's keys and values are shared by every wormhole. An update is atomic across wormholes: its body sees the
/// current values and no other update comes between its read and its write, so no increment is lost. A change is
/// recorded only when a value differs, with its sender, direction and keys, and every observer is told of it, in
/// order: by default an observer skips its own wormhole's changes (unless `includingOwnChanges`), and it can keep to
/// one direction and to some keys. `changes()` is the same as an `AsyncSequence`. Values are JSON: Codable values,
/// nested or not, and dates (to the second) read back as they were set.
@Suite("Contract: suites", .limit(minutes: 3))
struct SuiteContract {
    struct Settings: Codable, Sendable, Equatable {
        struct Display: Codable, Sendable, Equatable {
            var theme: String
            var scale: Double
            var panels: [String]
        }
        var name: String
        var display: Display
        var limits: [String: Int]
        var note: String?
    }

    @Test("Two wormholes × 100 concurrent update increments end at 200", arguments: EngineKind.underTest)
    func concurrentUpdates(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let suites = try ["app", "widget"].map { try fixture.wormhole($0).suite("counters") }
            let failures = Collector<String>()
            DispatchQueue.concurrentPerform(iterations: 2) { index in
                for _ in 0..<100 {
                    do {
                        try suites[index].update { values in
                            try values.set((values["count", as: Int.self] ?? 0) + 1, forKey: "count")
                        }
                    } catch {
                        failures.append("\(error)")
                    }
                }
            }
            #expect(failures.values.isEmpty)
            #expect(try suites[0].value(forKey: "count", as: Int.self) == 200)
            #expect(try suites[1].value(forKey: "count", as: Int.self) == 200)
            #expect(try fixture.wormhole("reader").suite("counters").value(forKey: "count", as: Int.self) == 200)
            #expect(try suites[0].store.read().version == 200, "one recorded change per update")
        }
    }

    @Test(
        "Observers get other wormholes' changes with sender and direction, their own only when asked",
        arguments: EngineKind.underTest
    )
    func observersAndOwnChanges(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app").suite("settings")
            let widget = try fixture.wormhole("widget").suite("settings")
            let others = Collector<SuiteChange>()
            let everything = Collector<SuiteChange>()
            let othersObserver = try app.observe { others.append($0) }
            let allObserver = try app.observe(includingOwnChanges: true) { everything.append($0) }

            try app.set("light", forKey: "theme", direction: "app→widget")
            try widget.set("dark", forKey: "theme", direction: "widget→app")
            #expect(eventually { everything.count == 2 && others.count >= 1 })

            let change = try #require(others.values.first)
            #expect(change.sender == "widget")
            #expect(change.direction == "widget→app")
            #expect(change.keys == ["theme"])
            #expect(change.values["theme", as: String.self] == "dark")
            #expect(everything.values.map(\.sender) == ["app", "widget"])
            #expect(everything.values.map(\.direction) == ["app→widget", "widget→app"])
            #expect(everything.values.map(\.version) == everything.values.map(\.version).sorted())

            // One more change of the widget's marks the end: the app's own change never reached `others`.
            try widget.set(true, forKey: "done")
            #expect(eventually { others.values.last?.keys == ["done"] })
            #expect(others.values.map(\.sender) == ["widget", "widget"])
            #expect(others.values.first?.direction == "widget→app")
            #expect(others.values.last?.direction == nil)
            othersObserver.cancel()
            allObserver.cancel()
        }
    }

    @Test("An observer of one direction gets only changes made with it", arguments: EngineKind.underTest)
    func directionFilter(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app").suite("settings")
            let received = Collector<SuiteChange>()
            let observer = try fixture.wormhole("widget").suite("settings").observe(direction: "app→widget") {
                received.append($0)
            }
            try app.set(1, forKey: "a", direction: "app→widget")
            try app.set(2, forKey: "b", direction: "app→watch")
            try app.set(3, forKey: "c")
            try app.set(4, forKey: "d", direction: "app→widget")
            #expect(eventually { received.values.last?.keys == ["d"] })
            #expect(received.values.map(\.keys) == [["a"], ["d"]])
            #expect(received.values.allSatisfy { $0.direction == "app→widget" && $0.sender == "app" })
            observer.cancel()
        }
    }

    @Test("An observer of some keys gets only changes to them, with only those keys", arguments: EngineKind.underTest)
    func keysFilter(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app").suite("settings")
            let received = Collector<SuiteChange>()
            let observer = try fixture.wormhole("widget").suite("settings").observe(keys: ["theme"]) {
                received.append($0)
            }
            try app.set(1, forKey: "volume")
            try app.update { values in
                try values.set("dark", forKey: "theme")
                try values.set(2, forKey: "volume")
            }
            try app.set("serif", forKey: "font")
            try app.set("light", forKey: "theme")
            try app.set("light", forKey: "theme")  // no difference: no change recorded
            try app.removeValue(forKey: "theme")
            #expect(eventually { received.count >= 3 })
            try app.set("last", forKey: "theme")
            #expect(eventually { received.values.last?.values["theme", as: String.self] == "last" })

            let changes = received.values
            #expect(changes.map(\.keys) == [["theme"], ["theme"], ["theme"], ["theme"]])
            #expect(changes.map { $0.values["theme", as: String.self] } == ["dark", "light", nil, "last"])
            observer.cancel()
        }
    }

    @Test("changes() yields other wormholes' changes as an AsyncSequence", arguments: EngineKind.underTest)
    func changesSequence(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let app = try fixture.wormhole("app").suite("settings")
        let widget = try fixture.wormhole("widget").suite("settings")
        let changes = widget.changes()
        let first = Task { () async throws -> SuiteChange? in
            for try await change in changes { return change }
            return nil
        }
        try app.set("dark", forKey: "theme", direction: "app→widget")
        let outcome = await result(of: first, within: 10)
        let finished = try #require(outcome, "a change arrives")
        let change = try #require(try finished.get())
        #expect(change.sender == "app")
        #expect(change.direction == "app→widget")
        #expect(change.keys == ["theme"])
        #expect(change.values["theme", as: String.self] == "dark")
    }

    @Test("A nested Codable struct round-trips", arguments: EngineKind.underTest)
    func codableRoundTrip(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app").suite("settings")
            let widget = try fixture.wormhole("widget").suite("settings")
            let settings = Settings(
                name: "main",
                display: .init(theme: "dark", scale: 1.5, panels: ["left", "right"]),
                limits: ["files": 10, "users": 3],
                note: nil
            )
            try app.set(settings, forKey: "settings")
            #expect(try widget.value(forKey: "settings", as: Settings.self) == settings)
            #expect(try widget.value(forKey: "missing", as: Settings.self) == nil)
            #expect(try widget.snapshot().keys == ["settings"])
        }
    }

    @Test("A Date to the second round-trips", arguments: EngineKind.underTest)
    func dateRoundTrip(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app").suite("settings")
            let widget = try fixture.wormhole("widget").suite("settings")
            let date = Date(timeIntervalSince1970: 1_700_000_000)
            try app.set(date, forKey: "updated")
            #expect(try widget.value(forKey: "updated", as: Date.self) == date)
            #expect(try app.value(forKey: "updated", as: Date.self) == date)
        }
    }
}
