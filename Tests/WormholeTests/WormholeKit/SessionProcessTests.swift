import Foundation
import Testing
import WormholeKit

/// A phone and a watch as real `wormhole session` processes: what the two session tests (one host on a directory,
/// two hosts on PostgreSQL) both play. `start(side, arguments)` starts `wormhole ARGUMENTS` on side 0 (the phone) or
/// side 1 (the watch), wherever the test places them.
struct SessionScenario {
    let start: (Int, [String]) throws -> RunningTool
    let scratch: String

    static let phone = ["--as", "phone", "--counterpart", "watch"]
    static let watchNames = ["--as", "watch", "--counterpart", "phone"]
    var watch: [String] { Self.watchNames + ["--into", scratch + "/inbox"] }

    /// Runs a command to its end; records an issue when it fails.
    @discardableResult
    func finish(_ side: Int, _ arguments: [String], timeout: Double = 60) throws -> WormholeTool.Result {
        let result = try start(side, arguments).finish(timeout: timeout)
        #expect(result.status == 0, "\(arguments) failed: \(result.error)")
        return result
    }

    static func events(_ lines: [String], _ kind: String) -> [[String: JSONValue]] {
        lines.compactMap { try? JSONDecoder().decode([String: JSONValue].self, from: Data($0.utf8)) }
            .filter { $0["event"]?.stringValue == kind }
    }

    static func numbers(_ lines: [String]) -> [Int] {
        events(lines, "userInfo").compactMap { $0["userInfo"]?["n"]?.intValue }
    }

    func play() throws {
        let files = 6
        let fileSize = 4 << 20
        // While the watch is away: three contexts, ten user info transfers, six files.
        for n in 1...3 { try finish(0, ["session", "context", "{\"n\":\(n)}"] + Self.phone) }
        for n in 0..<10 { try finish(0, ["session", "transfer-user-info", "{\"n\":\(n)}"] + Self.phone) }
        // One cancelled, and two "current" ones of which only the second is to arrive.
        let cancelled = try finish(0, ["session", "transfer-user-info", "{\"n\":100}"] + Self.phone).lines.first ?? ""
        try finish(0, ["session", "transfer-user-info", "--cancel", cancelled] + Self.phone)
        try finish(0, ["session", "transfer-user-info", "--current", "{\"c\":1}"] + Self.phone)
        try finish(0, ["session", "transfer-user-info", "--current", "{\"c\":2}"] + Self.phone)
        var originals: [String: Data] = [:]
        for index in 0..<files {
            let path = scratch + "/f\(index).bin"
            originals["f\(index).bin"] = try TransferContract.randomFile(path, count: fileSize)
            try finish(0, ["session", "transfer-file", path] + Self.phone)
        }
        let outstanding = try finish(0, ["session", "transfer-user-info", "--list"] + Self.phone)
        #expect(outstanding.lines.count == 11, "ten, and the second current one")

        // The watch activates and is killed once the first file is in.
        let first = try start(1, ["session", "watch", "--timeout", "120"] + watch)
        #expect(first.waitForError(containing: "watching watch→phone", timeout: 30))
        #expect(eventually(timeout: 60) { !Self.events(first.outputLines, "file").isEmpty })
        // Killed once it has recorded the context as received (after its handlers ran): then it never comes again.
        // Killed before that, it would come again, as the context in flight.
        #expect(
            eventually(timeout: 30) {
                let received = try? finish(1, ["session", "context"] + Self.watchNames)
                return received?.output.contains("\"n\":3") == true
            }
        )
        first.kill()
        let firstLines = first.finish(timeout: 20).lines
        let contexts = Self.events(firstLines, "context")
        #expect(contexts.count == 1, "one context: the newest")
        #expect(contexts.first?["context"] == ["n": 3])

        // The phone, a new process, queues more; the watch restarts and gets the rest, each once.
        for n in 10..<15 { try finish(0, ["session", "transfer-user-info", "{\"n\":\(n)}"] + Self.phone) }
        let second = try start(1, ["session", "watch", "--timeout", "120"] + watch)
        #expect(second.waitForError(containing: "watching watch→phone", timeout: 30))
        let inbox = scratch + "/inbox"
        #expect(
            eventually(timeout: 90) {
                Self.numbers(second.outputLines).last == 14
                    && ((try? FileManager.default.contentsOfDirectory(atPath: inbox).count) ?? 0) >= files
            }
        )

        // A message while the watch is there gets its reply.
        let reply = try finish(0, ["session", "send", "{\"ping\":1}"] + Self.phone)
        #expect(reply.output.contains("{}"))
        #expect(eventually { !Self.events(second.outputLines, "message").isEmpty })
        second.kill()
        let secondLines = second.finish(timeout: 20).lines
        #expect(Self.events(secondLines, "context").isEmpty, "the context it had is not delivered again")

        // Every user info once, in order; only the one in flight at the kill may come twice.
        var numbers = Self.numbers(firstLines)
        let later = Self.numbers(secondLines)
        numbers += later.first == numbers.last ? Array(later.dropFirst()) : later
        #expect(numbers == Array(0..<15))
        let currents = Self.events(firstLines + secondLines, "userInfo").compactMap { $0["userInfo"]?["c"]?.intValue }
        #expect(Set(currents) == [2], "the newest current one only")

        // Every file once, whole: a delivery cut by the kill resumed, and was not made twice.
        let received = try FileManager.default.contentsOfDirectory(atPath: inbox).sorted()
        #expect(received == originals.keys.sorted())
        for name in received {
            #expect(try Data(contentsOf: URL(fileURLWithPath: inbox + "/" + name)) == originals[name], "\(name)")
        }
        #expect(try finish(0, ["session", "transfer-user-info", "--list"] + Self.phone).lines.isEmpty)
        #expect(try finish(0, ["session", "transfer-file", "--list"] + Self.phone).lines.isEmpty)

        // The watch is gone: a message fails at once, saying why.
        let away = try start(0, ["session", "send", "{\"ping\":2}"] + Self.phone).finish(timeout: 30)
        #expect(away.status == 1)
        #expect(away.error.contains("not reachable"))
    }
}

@Suite("Sessions between processes", .limit(minutes: 3))
struct SessionProcessTests {
    @Test("A phone and a watch process on a directory: context, user info, files across kills and restarts, messages")
    func oneHost() async throws {
        try await offThePool {
            let temporary = TemporaryDirectory()
            let directory = temporary("wormhole")
            try SessionScenario(
                start: { _, arguments in try RunningTool(arguments + ["--directory", directory]) },
                scratch: temporary.path
            ).play()
        }
    }

    @Test("wormhole demo session runs on one host and exits 0")
    func demo() async throws {
        try await offThePool {
            let temporary = TemporaryDirectory()
            let result = try RunningTool(
                ["demo", "session", "--one-host"],
                environment: ["WORMHOLE_APP_GROUPS": temporary.path]
            ).finish(timeout: 150)
            #expect(result.status == 0, "\(result.error)")
            #expect(result.output.contains("didReceiveApplicationContext"))
            #expect(result.output.contains("reply {\"pong\":\"from the watch\"}"))
            #expect(result.output.contains("not reachable"))
        }
    }
}
