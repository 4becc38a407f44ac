import Foundation
import Testing

@testable import WormholeKit

/// Shared key-value suites: real processes updating one suite at once, killed mid-update, watched from elsewhere.
@Suite("Shared key-value suites", .limit(minutes: 2))
struct SuiteTests {
    let directory = TemporaryDirectory()
    var location: [String] { ["--directory", directory("wormhole")] }
    func makeSuite(sender: String = "tests") throws -> WormholeSuite {
        try Wormhole(directory: directory("wormhole"), configuration: .init(sender: sender)).suite("settings")
    }

    @Test("Typed values, several keys in one update, removal")
    func basics() async throws {
        try await offThePool {
            let suite = try makeSuite()
            try suite.set("dark", forKey: "theme")
            try suite.set(12, forKey: "size")
            #expect(try suite.value(forKey: "theme", as: String.self) == "dark")
            #expect(try suite.value(forKey: "size", as: Int.self) == 12)
            #expect(try suite.value(forKey: "missing", as: Int.self) == nil)
            try suite.update { (values: inout SuiteValues) throws(WormholeError) in
                try values.set(13, forKey: "size")
                values.removeValue(forKey: "theme")
            }
            #expect(try suite.snapshot().keys == ["size"])
            #expect(throws: WormholeError.self) { try suite.setJSON(Data("{nope".utf8), forKey: "bad") }
            #expect(throws: WormholeError.self) { try Wormhole(directory: directory("wormhole")).suite("../x") }
        }
    }

    @Test("Dates and data read back as written, from the suite, a snapshot, an update and a change")
    func datesAndData() async throws {
        try await offThePool {
            struct Stamp: Codable, Equatable {
                var at: Date
                var bytes: Data
            }
            let suite = try makeSuite()
            // ISO 8601 keeps whole seconds: a date with a fraction reads back without it.
            let now = Date()
            let whole = Date(timeIntervalSince1970: now.timeIntervalSince1970.rounded(.down))
            let bytes = Data([0, 1, 2, 0xFE, 0xFF])
            let changes = Collector<SuiteChange>()
            let observer = try suite.observe(includingOwnChanges: true, on: .notifierThread) { changes.append($0) }
            try suite.set(now, forKey: "d")
            try suite.set(bytes, forKey: "data")
            try suite.set(Stamp(at: whole, bytes: bytes), forKey: "stamp")
            #expect(try suite.value(forKey: "d", as: Date.self) == whole)
            #expect(try suite.value(forKey: "data", as: Data.self) == bytes)
            #expect(try suite.value(forKey: "stamp", as: Stamp.self) == Stamp(at: whole, bytes: bytes))
            let snapshot = try suite.snapshot()
            #expect(snapshot["d", as: Date.self] == whole)
            #expect(snapshot["data", as: Data.self] == bytes)
            // The JSON in the file is what other languages read: an ISO 8601 string and Base64.
            let json = try #require(snapshot.json(forKey: "d"))
            #expect(String(decoding: json, as: UTF8.self).hasPrefix("\""))
            try suite.update { (values: inout SuiteValues) throws(WormholeError) in
                #expect(values["d", as: Date.self] == whole)
                try values.set(whole.addingTimeInterval(60), forKey: "d")
            }
            #expect(try suite.value(forKey: "d", as: Date.self) == whole.addingTimeInterval(60))
            #expect(eventually { changes.count == 4 })
            #expect(changes.values.first?.values["d", as: Date.self] == whole)
            observer.cancel()
        }
    }

    @Test(
        "An update waiting for another process's lock holds up no read of its own process",
        .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/flock"), "needs util-linux's flock(1)")
    )
    func updateWaitsWithoutBlockingReads() async throws {
        try await offThePool {
            let suite = try makeSuite()
            try suite.set(1, forKey: "count")
            // Another process holds the suite file's lock (util-linux's flock(1), as a writer would).
            let path = directory("wormhole") + "/settings.suite"
            let holder = Process()
            holder.executableURL = URL(fileURLWithPath: "/usr/bin/flock")
            holder.arguments = ["--exclusive", "--close", path, "sleep", "60"]  // until terminated below
            try holder.run()
            defer { killWithChildren(holder.processIdentifier) }
            let probe = open(path, O_RDONLY | O_CLOEXEC)
            defer { close(probe) }
            let held = eventually {
                guard flock(probe, LOCK_EX | LOCK_NB) == 0 else { return true }
                flock(probe, LOCK_UN)  // not taken yet: let go, and look again
                return false
            }
            #expect(held, "the other process holds the lock")
            let updated = Flag()
            let thread = Thread {
                try? suite.set(2, forKey: "count")
                _ = updated.set()
            }
            thread.start()
            usleep(200_000)  // the update is waiting for the lock by now
            #expect(!updated.isSet)
            let started = Date()
            #expect(try suite.value(forKey: "count", as: Int.self) == 1)
            #expect(Date().timeIntervalSince(started) < 1, "the read did not wait for the update")
            #expect(!updated.isSet)
            killWithChildren(holder.processIdentifier)
            #expect(eventually { updated.isSet })
            #expect(try suite.value(forKey: "count", as: Int.self) == 2)
        }
    }

    /// Kills a process and its children with SIGKILL (the test runner's children may inherit SIGTERM blocked).
    private func killWithChildren(_ process: pid_t) {
        #if os(Linux) || os(Android)
        let children = (try? String(contentsOfFile: "/proc/\(process)/task/\(process)/children", encoding: .utf8)) ?? ""
        for child in children.split(separator: " ").compactMap({ pid_t($0) }) { kill(child, SIGKILL) }
        #endif
        kill(process, SIGKILL)
    }

    @Test("4 processes × 250 read-modify-write updates: none lost")
    func concurrentUpdates() async throws {
        try await offThePool {
            let writers = try (0..<4).map { index in
                try RunningTool(
                    ["exercise", "suite-increment", "--count", "250", "--identifier", "settings", "--tag", "w\(index)"]
                        + location
                )
            }
            for writer in writers { #expect(writer.finish(timeout: 90).status == 0) }
            let values = try makeSuite().snapshot()
            #expect(values["counter", as: Int.self] == 1000)
            for index in 0..<4 { #expect(values["writer-w\(index)", as: Int.self] == 250) }
        }
    }

    @Test("Writers killed mid-update never leave a torn suite nor half an update")
    func writersKilled() async throws {
        try await offThePool {
            for round in 0..<15 {
                let writer = try RunningTool(
                    [
                        "exercise", "suite-increment", "--count", "100000", "--identifier", "settings", "--tag",
                        "k\(round % 3)",
                    ] + location
                )
                usleep(UInt32.random(in: 20_000...80_000))
                writer.kill()
                _ = writer.finish()
                // Both keys change in one update: the counter always equals the sum of the writers' keys.
                let values = try makeSuite().snapshot()
                let sum = (0..<3).compactMap { values["writer-k\($0)", as: Int.self] }.reduce(0, +)
                #expect(values["counter", as: Int.self] ?? 0 == sum, "round \(round)")
            }
        }
    }

    @Test(
        "Another process sees each change with its sender and direction; its own changes and other directions are left out"
    )
    func watchedFromAnotherProcess() async throws {
        try await offThePool {
            let watcher = try RunningTool(
                ["defaults", "watch"] + location + [
                    "settings", "--key", "theme", "--direction", "app→widget", "--count", "2", "--timeout", "120",
                ]
            )
            #expect(watcher.waitForError(containing: "watching"))
            let app = try makeSuite(sender: "app")
            try app.set("dark", forKey: "theme", direction: "app→widget")
            try app.set(1, forKey: "size", direction: "app→widget")  // another key: not watched
            try app.set("blue", forKey: "theme", direction: "widget→app")  // another direction: not watched
            try app.set("light", forKey: "theme", direction: "app→widget")
            let result = watcher.finish()
            #expect(result.status == 0, "\(result.error)")
            #expect(result.lines.count == 2)
            #expect(result.lines.first?.contains(#""sender":"app""#) == true)
            #expect(result.lines.first?.contains(#""values":{"theme":"dark"}"#) == true)
            #expect(result.lines.last?.contains(#""values":{"theme":"light"}"#) == true)
        }
    }

    @Test("Updates of a large value compact the file now and then, not at every update")
    func compactionInProportion() async throws {
        try await offThePool {
            let suite = try makeSuite()
            let file = directory("wormhole/settings.suite")
            // Each compaction renames a new file into place: counted as a change of the inode (numbers are reused).
            var inode: UInt64 = 0
            var files = 0
            for round in 0..<12 {
                // 100 KB each time: before, each change outweighed the snapshot alone, and every update rewrote the
                // file with its 64 changes of history.
                try suite.set(String(repeating: String(round % 10), count: 100_000), forKey: "document")
                var status = stat()
                #expect(stat(file, &status) == 0)
                if UInt64(status.st_ino) != inode { files += 1 }
                inode = UInt64(status.st_ino)
            }
            #expect(files <= 5, "\(files) files for 12 updates")
            #expect(try suite.value(forKey: "document", as: String.self)?.first == "1")
        }
    }

    @Test("An observer that began before the suite existed is told the difference when the suite starts over")
    func observerBeforeTheSuiteSeesARestart() async throws {
        try await offThePool {
            let changes = Collector<String>()
            let observer = try makeSuite(sender: "widget").observe(on: .notifierThread) { change in
                if let theme = change.values["theme", as: String.self] { changes.append(theme) }
            }
            let app = try makeSuite(sender: "app")
            try app.set("dark", forKey: "theme")
            #expect(eventually { changes.values == ["dark"] })
            // Removed, as the error for a damaged suite says to do: the next update starts a new history at version 1.
            try FileManager.default.removeItem(atPath: directory("wormhole/settings.suite"))
            try app.set("light", forKey: "theme")
            #expect(eventually { changes.values == ["dark", "light"] })
            observer.cancel()
        }
    }

    @Test("In one process: observers skip their own changes and repost into NotificationCenter")
    func observersAndNotificationCenter() async throws {
        try await offThePool {
            let widget = try makeSuite(sender: "widget")
            let app = try makeSuite(sender: "app")
            let center = NotificationCenter()
            let reposted = Collector<String>()
            let token = center.addObserver(forName: Notification.Name("theme"), object: nil, queue: nil) { note in
                reposted.append(note.object as? String ?? "?")
            }
            let changes = Collector<SuiteChange>()
            let observer = try widget.observe(repostingTo: center) { changes.append($0) }
            try widget.set("own", forKey: "theme")
            try app.set("dark", forKey: "theme")
            #expect(eventually { changes.count == 1 && reposted.values == ["dark"] })
            #expect(changes.values.first?.sender == "app")
            #expect(changes.values.first?.keys == ["theme"])
            observer.cancel()
            center.removeObserver(token)
        }
    }

    @Test("get, set, delete and list from the command line")
    func commandLine() async throws {
        // Its only `try`s are inside `#expect`, which closure inference does not see: say that it throws.
        try await offThePool { () throws in
            #expect(
                try WormholeTool.run(["defaults", "set"] + location + ["settings", "theme", #""dark""#]).status == 0
            )
            #expect(try WormholeTool.run(["defaults", "set"] + location + ["settings", "size", "12"]).status == 0)
            #expect(
                try WormholeTool.run(["defaults", "get"] + location + ["settings", "theme"]).lines == [#""dark""#]
            )
            #expect(
                try WormholeTool.run(["defaults", "list"] + location + ["settings"]).lines == [
                    #"{"size":12,"theme":"dark"}"#
                ]
            )
            #expect(try WormholeTool.run(["defaults", "delete"] + location + ["settings", "size"]).status == 0)
            #expect(try WormholeTool.run(["defaults", "get"] + location + ["settings", "size"]).status == 1)
            #expect(try WormholeTool.run(["defaults", "set"] + location + ["settings", "bad", "{nope"]).status == 2)
            #expect(try makeSuite().value(forKey: "theme", as: String.self) == "dark")
        }
    }
}
