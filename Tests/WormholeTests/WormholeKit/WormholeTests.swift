import Foundation
import Synchronization
import Testing

@testable import WormholeKit

@Suite("Wormhole in one process", .limit(minutes: 3))
struct WormholeTests {
    let directory = TemporaryDirectory()

    func makeWormhole(_ configuration: Wormhole.Configuration = .init()) throws -> Wormhole {
        try Wormhole(directory: directory("wormhole"), configuration: configuration)
    }

    @Test("MMWormhole's calls: pass, read, clear one, clear all")
    func mmwormholeCalls() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            #expect(try wormhole.message(withIdentifier: "button", as: Tap.self) == nil)
            try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
            try wormhole.passMessageObject("hello", identifier: "greeting")
            #expect(try wormhole.message(withIdentifier: "button", as: Tap.self) == Tap(number: 1))
            #expect(try wormhole.message(withIdentifier: "greeting", as: String.self) == "hello")
            #expect(try wormhole.identifiers() == ["button", "greeting"])
            try wormhole.clearMessageContents(forIdentifier: "button")
            #expect(try wormhole.message(withIdentifier: "button", as: Tap.self) == nil)
            try wormhole.clearAllMessageContents()
            #expect(try wormhole.identifiers() == [])
        }
    }

    @Test("Group containers live under $WORMHOLE_APP_GROUPS, then XDG_DATA_HOME, then ~/.local/share")
    func groupContainer() async throws {
        try await offThePool {
            #expect(GroupContainer.rootDirectory(environment: ["WORMHOLE_APP_GROUPS": "/x", "HOME": "/h"]) == "/x")
            #expect(
                GroupContainer.rootDirectory(environment: ["XDG_DATA_HOME": "/d", "HOME": "/h"]) == "/d/app-groups"
            )
            #expect(GroupContainer.rootDirectory(environment: ["HOME": "/h"]) == "/h/.local/share/app-groups")
            let path = try GroupContainer.directory(
                forApplicationGroupIdentifier: "group.a",
                optionalDirectory: "w",
                environment: ["WORMHOLE_APP_GROUPS": directory.path]
            )
            #expect(path == directory.path + "/group.a/w")
            #expect(throws: WormholeError.self) {
                try GroupContainer.directory(forApplicationGroupIdentifier: "../etc", optionalDirectory: nil)
            }
            #expect(throws: WormholeError.self) {
                try GroupContainer.directory(forApplicationGroupIdentifier: "group.a", optionalDirectory: "a/b")
            }
        }
    }

    @Test("A message of another type is a decoding error that names both sides")
    func typeMismatch() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            try wormhole.passMessageObject("not a tap", identifier: "button")
            let error = #expect(throws: WormholeError.self) {
                try wormhole.message(withIdentifier: "button", as: Tap.self)
            }
            #expect(error?.code == .decodingFailed)
            #expect(error?.underlyingError is DecodingError)
            #expect(error?.message.contains("Tap") == true)
        }
    }

    @Test("Raw data and other coders round-trip")
    func rawDataAndCoders() async throws {
        try await offThePool {
            let wormhole = try makeWormhole(.init(coder: PropertyListMessageCoder()))
            try wormhole.passMessageData(Data([0, 1, 2, 255]), identifier: "raw")
            #expect(try wormhole.messageData(withIdentifier: "raw") == Data([0, 1, 2, 255]))
            try wormhole.passMessageObject(Tap(number: 9), identifier: "plist")
            #expect(try wormhole.message(withIdentifier: "plist", as: Tap.self) == Tap(number: 9))
        }
    }

    @Test("Envelopes record the sender, the time and a growing sequence")
    func envelopes() async throws {
        try await offThePool {
            let wormhole = try makeWormhole(.init(sender: "app"))
            let before = Date()
            let first = try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
            let second = try wormhole.passMessageObject(Tap(number: 2), identifier: "button")
            let read = try #require(try wormhole.envelope(withIdentifier: "button"))
            #expect(read == second && second.sequence == first.sequence + 1)
            #expect(read.sender == "app")
            #expect(abs(read.date.timeIntervalSince(before)) < 60)
        }
    }

    @Test("Several listeners of one identifier each get every message; cancelling one leaves the others")
    func manyListeners() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let collectors = (0..<3).map { _ in Collector<Int>() }
            var listeners = try collectors.map { collector in
                try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) { collector.append($0.number) }
            }
            try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
            #expect(eventually { collectors.allSatisfy { $0.values == [1] } })
            listeners[0].cancel()
            #expect(listeners[0].isCancelled)
            try wormhole.passMessageObject(Tap(number: 2), identifier: "button")
            #expect(eventually { collectors[1].values == [1, 2] && collectors[2].values == [1, 2] })
            usleep(100_000)
            #expect(collectors[0].values == [1])
            // Releasing a handle stops its listener.
            listeners.removeLast()
            try wormhole.passMessageObject(Tap(number: 3), identifier: "button")
            #expect(eventually { collectors[1].values == [1, 2, 3] })
            usleep(100_000)
            #expect(collectors[2].values == [1, 2])
            _ = listeners
        }
    }

    @Test("stopListeningForMessage stops every listener of the identifier in this wormhole")
    func stopListening() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let other = try makeWormhole()
            let mine = Collector<Int>()
            let theirs = Collector<Int>()
            let first = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) { mine.append($0.number) }
            let second = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) {
                mine.append($0.number)
            }
            let third = try other.listenForMessage(withIdentifier: "button", as: Tap.self) { theirs.append($0.number) }
            wormhole.stopListeningForMessage(withIdentifier: "button")
            try other.passMessageObject(Tap(number: 1), identifier: "button")
            #expect(eventually { theirs.values == [1] })
            usleep(100_000)
            #expect(mine.values.isEmpty)
            _ = (first, second, third)
        }
    }

    @Test("A listener can start with the message already there, to catch up after being away")
    func deliveringCurrent() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            try wormhole.passMessageObject(Tap(number: 7), identifier: "button")
            let caughtUp = Collector<Int>()
            let fresh = Collector<Int>()
            let a = try wormhole.listenForMessage(
                withIdentifier: "button",
                as: Tap.self,
                deliveringCurrentMessage: true
            ) {
                caughtUp.append($0.number)
            }
            let b = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) { fresh.append($0.number) }
            #expect(eventually { caughtUp.values == [7] })
            try wormhole.passMessageObject(Tap(number: 8), identifier: "button")
            #expect(eventually { caughtUp.values == [7, 8] && fresh.values == [8] })
            _ = (a, b)
        }
    }

    @Test("Rapid sends reach a listener in order, never older after newer, never twice, ending with the last")
    func rapidSendsNeverGoBackwards() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: "counter", as: Int.self, on: .notifierThread) {
                received.append($0)
            }
            for number in 1...2000 { try wormhole.passMessageObject(number, identifier: "counter") }
            #expect(eventually { received.values.last == 2000 })
            let values = received.values
            #expect(zip(values, values.dropFirst()).allSatisfy { $0 < $1 }, "strictly increasing")
            _ = listener
        }
    }

    @Test("Callbacks run where the caller says")
    func callbackExecution() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let queue = DispatchQueue(label: "test.callbacks")
            let key = DispatchSpecificKey<String>()
            queue.setSpecific(key: key, value: "mine")
            let onQueue = Collector<Bool>()
            let threads = Collector<String>()
            let a = try wormhole.listenForMessage(withIdentifier: "x", as: Int.self, on: .queue(queue)) { _ in
                onQueue.append(DispatchQueue.getSpecific(key: key) == "mine")
            }
            let b = try wormhole.listenForMessage(withIdentifier: "x", as: Int.self, on: .notifierThread) { _ in
                threads.append(currentThreadName())
            }
            try wormhole.passMessageObject(1, identifier: "x")
            #expect(eventually { onQueue.values == [true] && threads.count == 1 })
            #expect(threads.values.first?.hasPrefix("wh-") == true, "ran on thread \(threads.values)")
            _ = (a, b)
        }
    }

    @Test("A damaged mailbox reaches the error handler and listening goes on")
    func listenerSurvivesCorruptFile() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<Int>()
            let errors = Collector<WormholeError.Code>()
            let listener = try wormhole.listenForMessage(
                withIdentifier: "button",
                as: Tap.self,
                errorHandler: { errors.append($0.code) }
            ) { received.append($0.number) }
            // Written over in place, truncated first: the listener, woken by the file's own writes, may read it
            // empty before it reads it damaged, and the post wakes it once more.
            try Data("garbage that is not a mailbox file at all, no magic here........".utf8)
                .write(to: URL(fileURLWithPath: directory("wormhole/button.msg")))
            try wormhole.notifier.post("mailbox.button")
            #expect(eventually { errors.values.last == .corruptMessage })
            try wormhole.passMessageObject("wrong type", identifier: "button")
            #expect(eventually { errors.values.last == .decodingFailed })
            try wormhole.passMessageObject(Tap(number: 5), identifier: "button")
            #expect(eventually { received.values == [5] })
            // Each wake-up on the damaged file reported it (a truncated or a corrupt file); the wrong type once.
            let damage = errors.values.prefix { $0 != .decodingFailed }
            #expect(!damage.isEmpty && damage.allSatisfy { $0 == .corruptMessage || $0 == .truncatedMessage })
            #expect(errors.values.dropFirst(damage.count) == [.decodingFailed], "\(errors.values)")
            _ = listener
        }
    }

    @Test("The AsyncSequence yields new messages, and ends with a typed error for a bad one")
    func asyncSequence() async throws {
        let wormhole = try makeWormhole()
        let messages = wormhole.messages(withIdentifier: "button", as: Tap.self)
        let reader = Task { () -> ([Int], WormholeError.Code?) in
            var seen: [Int] = []
            do {
                for try await tap in messages { seen.append(tap.number) }
            } catch let error as WormholeError {
                return (seen, error.code)
            } catch {
                Issue.record("unexpected error \(error)")
            }
            return (seen, nil)
        }
        // Pass, wait until it is taken, pass again: the sequence keeps the newest, so pace the test.
        try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
        try await Task.sleep(for: .milliseconds(200))
        try wormhole.passMessageObject(Tap(number: 2), identifier: "button")
        try await Task.sleep(for: .milliseconds(200))
        try wormhole.passMessageObject("not a tap", identifier: "button")
        let (seen, code) = await reader.value
        #expect(seen == [1, 2])
        #expect(code == .decodingFailed)
    }

    @Test("An invalid identifier ends the AsyncSequence at once and makes listening throw")
    func invalidIdentifierWhileListening() async throws {
        let wormhole = try makeWormhole()
        await #expect(throws: WormholeError.self) {
            for try await _ in wormhole.messages(withIdentifier: "../escape", as: Tap.self) {}
        }
        #expect(throws: WormholeError.self) {
            try wormhole.listenForMessage(withIdentifier: "a/b", as: Tap.self) { _ in }
        }
        #expect(throws: WormholeError.self) { try wormhole.passMessageObject(1, identifier: "") }
    }

    @Test("Cancelling the task that iterates stops listening")
    func sequenceCancellation() async throws {
        let wormhole = try makeWormhole()
        let task = Task {
            for try await _ in wormhole.messages(withIdentifier: "button", as: Tap.self) {}
        }
        try await Task.sleep(for: .milliseconds(50))
        task.cancel()
        _ = await task.result
        #expect(wormhole.registry.isEmpty)
    }

    @Test("The polling strategy delivers too, for file systems inotify cannot watch")
    func pollingStrategy() async throws {
        try await offThePool {
            let wormhole = try makeWormhole(.init(notification: .polling(interval: .milliseconds(10))))
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) {
                received.append($0.number)
            }
            try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
            #expect(eventually { received.values == [1] })
            try wormhole.passMessageObject(Tap(number: 2), identifier: "button")
            #expect(eventually { received.values == [1, 2] })
            _ = listener
        }
    }

    @Test("The longest identifier works: a message passed on one thread wakes a listener on another")
    func longestIdentifier() async throws {
        try await offThePool {
            let identifier = String(repeating: "x", count: MessageIdentifier.maximumLength)
            let wormhole = try makeWormhole()
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: identifier, as: Tap.self, on: .notifierThread)
            {
                received.append($0.number)
            }
            let failures = Collector<String>()
            let sent = DispatchSemaphore(value: 0)
            Thread {
                do {
                    try wormhole.passMessageObject(Tap(number: 7), identifier: identifier)
                } catch {
                    failures.append("\(error)")
                }
                sent.signal()
            }.start()
            #expect(sent.wait(timeout: .now() + 10) == .success)
            #expect(failures.values.isEmpty)
            #expect(eventually(timeout: 5) { received.values == [7] })
            #expect(try wormhole.message(withIdentifier: identifier, as: Tap.self) == Tap(number: 7))
            listener.cancel()
        }
    }

    @Test("A suite and a queue with the longest name notify as short ones do")
    func longestSuiteAndQueueNames() async throws {
        try await offThePool {
            let name = String(repeating: "é", count: MessageIdentifier.maximumLength / 2)
            let suite = try makeWormhole().suite(name)
            let changes = Collector<Set<String>>()
            let observer = try suite.observe(includingOwnChanges: true, on: .notifierThread) { changes.append($0.keys) }
            try suite.set("dark", forKey: "theme")
            #expect(eventually(timeout: 5) { changes.values == [["theme"]] })
            observer.cancel()
            let queue = try makeWormhole().queue(name)
            let received = Collector<Int>()
            let consumer = try queue.consume(consumer: "c", as: Tap.self, on: .notifierThread) {
                received.append($0.value.number)
            }
            try queue.enqueue(Tap(number: 1))
            #expect(eventually(timeout: 5) { received.values == [1] })
            consumer.cancel()
        }
    }

    @Test("Coordinated wormholes behave the same and offer a consistent snapshot")
    func coordinated() async throws {
        try await offThePool {
            let wormhole = try makeWormhole(.init(coordination: .coordinated))
            try wormhole.passMessageObject(Tap(number: 1), identifier: "a")
            try wormhole.passMessageObject(Tap(number: 2), identifier: "b")
            let transiting = try #require(wormhole.transiting as? CoordinatedFileTransiting)
            #expect(try transiting.snapshot().keys.sorted() == ["a", "b"])
            try wormhole.clearAllMessageContents()
            #expect(try transiting.snapshot().isEmpty)
            #expect(FileManager.default.fileExists(atPath: directory("wormhole/.coordination.lock")))
        }
    }
}

extension ListenerRegistry {
    /// Whether no identifier is listened to (tests only).
    var isEmpty: Bool { countForTesting == 0 }
}

@Suite("Notifiers", .limit(minutes: 3))
struct NotifierTests {
    let directory = TemporaryDirectory()

    @Test("A post wakes the observers of its name only")
    func postWakesItsNameOnly() async throws {
        try await offThePool {
            let notifier = try DirectoryNotifier(directory: directory("w"), strategy: .inotify)
            let pings = Collector<Int>()
            let pongs = Collector<Int>()
            let a = try notifier.observe("ping") { pings.append(1) }
            let b = try notifier.observe("pong") { pongs.append(1) }
            try notifier.post("ping")
            #expect(eventually { pings.count == 1 })
            usleep(100_000)
            #expect(pongs.count == 0)
            _ = (a, b)
        }
    }

    @Test("Observers keep working after the notification file is deleted from under them")
    func deletedNotificationFile() async throws {
        try await offThePool {
            let notifier = try DirectoryNotifier(directory: directory("w"), strategy: .inotify)
            let fired = Collector<Int>()
            let observation = try notifier.observe("ping") { fired.append(1) }
            try notifier.post("ping")
            #expect(eventually { fired.count >= 1 })
            #expect(unlink(directory("w/.notifications/ping")) == 0)
            #expect(eventually { FileManager.default.fileExists(atPath: directory("w/.notifications/ping")) })
            let before = fired.count
            try notifier.post("ping")
            #expect(eventually { fired.count > before })
            _ = observation
        }
    }

    @Test("A cancelled observation is not called again")
    func cancelledObservation() async throws {
        try await offThePool {
            let notifier = try DirectoryNotifier(directory: directory("w"), strategy: .inotify)
            let fired = Collector<Int>()
            let observation = try notifier.observe("ping") { fired.append(1) }
            observation.cancel()
            try notifier.post("ping")
            usleep(100_000)
            #expect(fired.count == 0)
        }
    }

    @Test("Notification names follow the identifier rules")
    func invalidNames() async throws {
        try await offThePool {
            let notifier = try DirectoryNotifier(directory: directory("w"))
            #expect(throws: WormholeError.self) { try notifier.post("../x") }
            #expect(throws: WormholeError.self) { try notifier.observe("a/b") {} }
            #expect(throws: WormholeError.self) { try notifier.post(".hidden") }
            #expect(throws: WormholeError.self) { try notifier.post(String(repeating: "x", count: 256)) }
            try notifier.post(String(repeating: "x", count: 255))
        }
    }

    @Test(
        "Every prefix with the longest identifier is a name that posts and observes",
        arguments: [
            "mailbox.", "queue.", "suite.", "store.",
        ]
    )
    func longestIdentifierWithPrefix(_ prefix: String) async throws {
        try await offThePool {
            let name = prefix + String(repeating: "x", count: MessageIdentifier.maximumLength)
            let notifier = try DirectoryNotifier(directory: directory("w"), strategy: .inotify)
            let fired = Collector<Int>()
            let observation = try notifier.observe(name) { fired.append(1) }
            try notifier.post(name)
            #expect(eventually(timeout: 5) { fired.count >= 1 })
            observation.cancel()
        }
    }
}
