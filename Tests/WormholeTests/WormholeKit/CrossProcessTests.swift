import Foundation
import Testing

@testable import WormholeKit

/// Real processes: the package's `wormhole` executable on one side, this test process (or more copies of the
/// executable) on the other, sharing a directory of real files woken by real inotify.
@Suite("Between processes", .limit(minutes: 2))
struct CrossProcessTests {
    let directory = TemporaryDirectory()
    var location: [String] { ["--directory", directory("wormhole")] }

    func makeWormhole() throws -> Wormhole { try Wormhole(directory: directory("wormhole")) }

    @Test("The executable under test exists")
    func executableExists() async throws {
        try await offThePool {
            #expect(FileManager.default.isExecutableFile(atPath: WormholeTool.path), "looked for \(WormholeTool.path)")
        }
    }

    @Test("A message passed from the command line is read in Swift, and the reverse")
    func cliAndSwiftInterchange() async throws {
        try await offThePool {
            let sent = try WormholeTool.run(["send"] + location + ["button", #"{"number": 3}"#])
            #expect(sent.status == 0, "\(sent.error)")
            let wormhole = try makeWormhole()
            #expect(try wormhole.message(withIdentifier: "button", as: Tap.self) == Tap(number: 3))
            try wormhole.passMessageObject(Tap(number: 4), identifier: "button")
            let read = try WormholeTool.run(["read"] + location + ["button"])
            #expect(read.status == 0)
            #expect(read.lines == [#"{"number":4}"#])
            let piped = try WormholeTool.run(["send"] + location + ["piped"], input: "[1, 2, 3]\n")
            #expect(piped.status == 0)
            #expect(try wormhole.message(withIdentifier: "piped", as: [Int].self) == [1, 2, 3])
        }
    }

    @Test("The command line refuses bad input with a message and writes nothing")
    func cliErrors() async throws {
        try await offThePool {
            let empty = try WormholeTool.run(["read"] + location + ["nothing"])
            #expect(empty.status == 1)
            #expect(empty.error.contains("empty"))
            let invalid = try WormholeTool.run(["send"] + location + ["button", "{not json"])
            #expect(invalid.status == 2)
            #expect(invalid.error.contains("not valid JSON"))
            #expect(try makeWormhole().identifiers().isEmpty)
            let escape = try WormholeTool.run(["send"] + location + ["../escape", "1"])
            #expect(escape.status != 0)
            #expect(escape.error.contains("invalid identifier"))
            let noLocation = try WormholeTool.run(["read", "button"])
            #expect(noLocation.status != 0)
            #expect(noLocation.error.contains("--group"))
        }
    }

    @Test("list, clear and clear --all from the command line")
    func cliListAndClear() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            for identifier in ["a", "b", "c"] { try wormhole.passMessageObject(1, identifier: identifier) }
            #expect(try WormholeTool.run(["list"] + location).lines == ["a", "b", "c"])
            #expect(try WormholeTool.run(["clear"] + location + ["b"]).status == 0)
            #expect(try WormholeTool.run(["list"] + location).lines == ["a", "c"])
            #expect(try WormholeTool.run(["clear", "--all"] + location).status == 0)
            #expect(try WormholeTool.run(["list"] + location).lines == [])
        }
    }

    @Test("A listener in another process receives each message passed here, one JSON line each")
    func listenerInChild() async throws {
        try await offThePool {
            let listener = try RunningTool(["listen"] + location + ["button", "--count", "3", "--timeout", "120"])
            #expect(listener.waitUntilListening())
            let wormhole = try makeWormhole()
            for number in 1...3 {
                try wormhole.passMessageObject(Tap(number: number), identifier: "button")
                // Wait until it is printed: a mailbox may coalesce sends that come faster than the listener.
                #expect(eventually { listener.outputLines.count == number })
            }
            let result = listener.finish()
            #expect(result.status == 0, "\(result.error)")
            #expect(result.lines == [#"{"number":1}"#, #"{"number":2}"#, #"{"number":3}"#])
        }
    }

    @Test("wormhole send with the longest identifier stores the message, exits 0 and wakes a listener here")
    func sendLongestIdentifier() async throws {
        try await offThePool {
            let identifier = String(repeating: "x", count: MessageIdentifier.maximumLength)
            let wormhole = try makeWormhole()
            let received = Collector<Tap>()
            let listener = try wormhole.listenForMessage(withIdentifier: identifier, as: Tap.self) {
                received.append($0)
            }
            let sent = try WormholeTool.run(["send"] + location + [identifier, #"{"number":5}"#])
            #expect(sent.status == 0, "\(sent.error)")
            #expect(eventually(timeout: 10) { received.values == [Tap(number: 5)] })
            listener.cancel()
        }
    }

    @Test("Many listener processes all receive the message")
    func manyListenerProcesses() async throws {
        try await offThePool {
            let listeners = try (0..<4).map { _ in
                try RunningTool(["listen"] + location + ["button", "--count", "1", "--timeout", "120"])
            }
            for listener in listeners { #expect(listener.waitUntilListening()) }
            try makeWormhole().passMessageObject(Tap(number: 42), identifier: "button")
            for listener in listeners {
                let result = listener.finish()
                #expect(result.status == 0)
                #expect(result.lines == [#"{"number":42}"#])
            }
        }
    }

    @Test("A listener here receives messages passed by other processes; a late process reads what was left")
    func listenerHere() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<Tap>()
            let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) { received.append($0) }
            #expect(try WormholeTool.run(["send"] + location + ["button", #"{"number":1}"#]).status == 0)
            #expect(eventually { received.values == [Tap(number: 1)] })
            listener.cancel()
            // The sender has exited; a process started now still finds the message.
            let late = try WormholeTool.run(["read", "--envelope"] + location + ["button"])
            #expect(late.output.contains(#""payload":{"number":1}"#))
            #expect(late.output.contains(#""sequence":1"#))
        }
    }

    @Test("Rapid sends from another process never go backwards, never repeat, and end with the last")
    func rapidSendsAcrossProcesses() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: "counter", as: Int.self, on: .notifierThread) {
                received.append($0)
            }
            let sender = try WormholeTool.run(["exercise", "rapid-send", "--count", "5000"] + location)
            #expect(sender.status == 0, "\(sender.error)")
            #expect(eventually { received.values.last == 5000 })
            let values = received.values
            #expect(zip(values, values.dropFirst()).allSatisfy { $0 < $1 })
            _ = listener
        }
    }

    @Test("Writers in many processes serialise cleanly: no write lost, no file torn")
    func concurrentWriterProcesses() async throws {
        try await offThePool {
            let writers = try (0..<4).map { index in
                try RunningTool(
                    ["exercise", "write", "--count", "500", "--identifier", "shared", "--tag", "w\(index)"] + location
                )
            }
            for writer in writers { #expect(writer.finish().status == 0) }
            let envelope = try #require(try makeWormhole().envelope(withIdentifier: "shared"))
            #expect(envelope.sequence == 2000, "every write took its own sequence number")
            #expect(try makeWormhole().message(withIdentifier: "shared", as: [String: String].self)?["index"] == "499")
        }
    }

    @Test("A listener process keeps working after a corrupt file appears")
    func listenerSurvivesCorruptFile() async throws {
        try await offThePool {
            let listener = try RunningTool(["listen"] + location + ["button", "--count", "1", "--timeout", "120"])
            #expect(listener.waitUntilListening())
            let wormhole = try makeWormhole()
            try Data(repeating: 0x5A, count: 300).write(to: URL(fileURLWithPath: directory("wormhole/button.msg")))
            try wormhole.notifier.post("mailbox.button")
            #expect(eventually { listener.errorSoFar.contains("corrupt message") })
            try wormhole.passMessageObject(Tap(number: 8), identifier: "button")
            let result = listener.finish()
            #expect(result.status == 0)
            #expect(result.lines == [#"{"number":8}"#])
        }
    }

    @Test("With coordination, a reader never sees a half-cleared wormhole while another process clears it")
    func coordinatedClearing() async throws {
        try await offThePool {
            let coordinated = location + ["--coordinated"]
            let cycler = try RunningTool(["exercise", "pass-then-clear", "--count", "1500"] + coordinated)
            let transiting = try CoordinatedFileTransiting(directory: directory("wormhole"))
            var snapshots = 0
            var sawBoth = false
            while cycler.isRunning {
                let snapshot = try transiting.snapshot()
                snapshots += 1
                // "a" is passed before "b", and both are cleared at once: "b" alone would be a half-cleared view.
                #expect(!(snapshot["b"] != nil && snapshot["a"] == nil), "half-cleared: \(snapshot.keys.sorted())")
                if snapshot.count == 2 { sawBoth = true }
            }
            #expect(cycler.finish().status == 0)
            #expect(snapshots > 10)
            _ = sawBoth
        }
    }
}
