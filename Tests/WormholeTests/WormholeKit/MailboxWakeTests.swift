import Foundation
import Testing

@testable import WormholeKit

/// On a directory, a mailbox's own file wakes its listeners (`FORMAT.md`, "Notifications"): a pass writes the mailbox
/// and nothing else, listeners watch the file (or poll it), and every way the file is written or replaced wakes them.
@Suite("Mailbox files wake their listeners", .limit(minutes: 2))
struct MailboxWakeTests {
    let directory = TemporaryDirectory()
    var location: [String] { ["--directory", directory("wormhole")] }

    func makeWormhole(_ configuration: Wormhole.Configuration = .init()) throws -> Wormhole {
        try Wormhole(directory: directory("wormhole"), configuration: configuration)
    }

    /// The size and contents of a file, or nil when it is missing.
    func contents(_ name: String) -> Data? { FileManager.default.contents(atPath: directory("wormhole/" + name)) }

    @Test("A pass wakes a listener in another process and writes no notification file")
    func passWritesOneFile() async throws {
        try await offThePool {
            let listener = try RunningTool(["listen"] + location + ["button", "--count", "3", "--timeout", "120"])
            #expect(listener.waitUntilListening())
            // The listener observes the name too, so that a post wakes it: its file is there, empty.
            #expect(contents(".notifications/mailbox.button") == Data())
            let wormhole = try makeWormhole()
            for number in 1...3 {
                try wormhole.passMessageObject(Tap(number: number), identifier: "button")
                #expect(eventually { listener.outputLines.count == number })
            }
            let result = listener.finish()
            #expect(result.status == 0)
            #expect(result.lines == [#"{"number":1}"#, #"{"number":2}"#, #"{"number":3}"#])
            #expect(contents(".notifications/mailbox.button") == Data(), "no pass posted")
        }
    }

    @Test("A listener makes a missing mailbox file, which holds no message and is not listed")
    func listenerMakesEmptyMailbox() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: "fresh", as: Tap.self) {
                received.append($0.number)
            }
            let file = try #require(contents("fresh.msg"))
            #expect(file.count == MailboxFormat.headerSize + 2 * MailboxFormat.minimumSlotCapacity)
            var status = stat()
            #expect(stat(directory("wormhole/fresh.msg"), &status) == 0 && status.st_mode & 0o777 == 0o600)
            #expect(try wormhole.message(withIdentifier: "fresh", as: Tap.self) == nil)
            #expect(try wormhole.identifiers() == [])
            // Clearing it writes nothing; a pass goes into the listener's file, in place.
            let before = contents("fresh.msg")
            try wormhole.clearMessageContents(forIdentifier: "fresh")
            #expect(contents("fresh.msg") == before)
            // The first message replaces the file whole (a reader never meets it half written), as sequence 1.
            var made = stat()
            #expect(stat(directory("wormhole/fresh.msg"), &made) == 0)
            let envelope = try makeWormhole().passMessageObject(Tap(number: 7), identifier: "fresh")
            #expect(envelope.sequence == 1)
            #expect(eventually { received.values == [7] })
            var replaced = stat()
            #expect(stat(directory("wormhole/fresh.msg"), &replaced) == 0 && replaced.st_ino != made.st_ino)
            #expect(try wormhole.identifiers() == ["fresh"])
            listener.cancel()
        }
    }

    @Test("A message that outgrows its slots, a cleared mailbox and a repaired file all wake the listener")
    func replacedFilesWake() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<String>()
            let listener = try wormhole.listenForMessage(withIdentifier: "note", as: String.self) {
                received.append($0)
            }
            let writer = try makeWormhole()
            try writer.passMessageObject("small", identifier: "note")
            #expect(eventually { received.values == ["small"] })
            // Larger than a 512-byte slot: a new file, renamed over the one watched.
            let large = String(repeating: "x", count: 5_000)
            try writer.passMessageObject(large, identifier: "note")
            #expect(eventually { received.values == ["small", large] })
            try writer.passMessageObject("small again", identifier: "note")
            #expect(eventually { received.values == ["small", large, "small again"] })
            // Cleared: nothing to deliver, and the next message is still new.
            try writer.clearMessageContents(forIdentifier: "note")
            try writer.passMessageObject("after clearing", identifier: "note")
            #expect(eventually { received.values.last == "after clearing" })
            // Damaged by another program, then replaced by the next pass (a new generation, renamed into place).
            let handle = try #require(FileHandle(forWritingAtPath: directory("wormhole/note.msg")))
            try handle.write(contentsOf: Data(repeating: 0xEE, count: 64))
            try handle.close()
            try writer.passMessageObject("repaired", identifier: "note")
            #expect(eventually { received.values.last == "repaired" })
            #expect(received.values == ["small", large, "small again", "after clearing", "repaired"])
            listener.cancel()
        }
    }

    /// A listener of "note" (its errors collected) that received `texts` from a writer that accepts other users'
    /// files, so that it writes on after the file changed hands.
    struct TrustingPair {
        let wormhole: Wormhole
        let writer: Wormhole
        let received: Collector<String>
        let errors: Collector<WormholeError.Code>
        let listener: MessageListener
    }

    func listenerAndTrustingWriter(receiving texts: [String]) throws -> TrustingPair {
        let wormhole = try makeWormhole()
        let received = Collector<String>()
        let errors = Collector<WormholeError.Code>()
        let listener = try wormhole.listenForMessage(
            withIdentifier: "note",
            as: String.self,
            errorHandler: { errors.append($0.code) }
        ) { received.append($0) }
        let writer = try makeWormhole(.init(fileOptions: FileTransiting.Options(trustsOtherOwners: true)))
        for text in texts {
            try writer.passMessageObject(text, identifier: "note")
            #expect(eventually { received.values.last == text })
        }
        return TrustingPair(wormhole: wormhole, writer: writer, received: received, errors: errors, listener: listener)
    }

    @Test(
        "A mailbox file given to another user while listened to is refused at the listener's next read",
        .enabled(if: geteuid() == 0, "only root may give a file to another user")
    )
    // A listener woken by its watch reads a descriptor checked before with no `fstat`, until an event of the watch
    // says the file may have changed: a change of owner is such an event, so the next read checks again.
    func ownerChangedWhileListening() async throws {
        try await offThePool {
            let pair = try listenerAndTrustingWriter(receiving: ["first", "second", "third"])
            #expect(chown(directory("wormhole/note.msg"), 54_321, 54_321) == 0)
            try pair.writer.passMessageObject("given away", identifier: "note")
            #expect(eventually { pair.errors.values.contains(.untrustedFile) }, "\(pair.errors.values)")
            #expect(pair.received.values == ["first", "second", "third"])
            pair.listener.cancel()
        }
    }

    @Test(
        "A listener's read made off the inotify thread checks its descriptor, however recently it was checked",
        .enabled(if: geteuid() == 0, "only root may give a file to another user")
    )
    // Off that thread the event that says the file changed hands may not have been read yet: the read must not
    // trust what the last check found.
    func readOffTheInotifyThreadChecks() async throws {
        try await offThePool {
            let pair = try listenerAndTrustingWriter(receiving: ["first", "second"])
            let files = try #require(pair.wormhole.transiting as? FileTransiting)
            #expect(try files.readMessageOnWake(identifier: "note")?.payload == Data(#""second""#.utf8))
            #expect(chown(directory("wormhole/note.msg"), 54_321, 54_321) == 0)
            #expect {
                try files.readMessageOnWake(identifier: "note")
            } throws: {
                ($0 as? WormholeError)?.code == .untrustedFile
            }
            pair.listener.cancel()
        }
    }

    @Test("A listened mailbox whose file grows past 16 KiB wakes its listener for every message, large or small")
    // A woken listener reads a small file whole with one `pread` and no `fstat`; a file past that memory (its slots
    // grown, and kept for the small messages after) is checked and read by its size each time.
    func largeFileWakes() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: "big", as: String.self) {
                received.append($0.count)
            }
            let writer = try makeWormhole()
            for count in [10, 20, 40_000, 40_001, 40_002, 30, 31] {
                try writer.passMessageObject(String(repeating: "y", count: count), identifier: "big")
                #expect(eventually { received.values.last == count }, "\(received.values)")
            }
            #expect(try #require(contents("big.msg")).count > 16 * 1024)
            listener.cancel()
        }
    }

    @Test("A damaged mailbox cleared (its file removed) and passed to at once, again and again, keeps waking")
    // The listener watches the path again after each removal; where the file system gives the new file the old one's
    // inode number, only the watch descriptor tells the files apart, which is what the monitor compares.
    func removedAndMadeAgain() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<String>()
            let listener = try wormhole.listenForMessage(
                withIdentifier: "note",
                as: String.self,
                errorHandler: { _ in }
            ) { received.append($0) }
            let writer = try makeWormhole()
            for round in 1...30 {
                let handle = try #require(FileHandle(forWritingAtPath: directory("wormhole/note.msg")))
                try handle.write(contentsOf: Data(repeating: 0xEE, count: 64))
                try handle.close()
                // Clearing a damaged mailbox removes its file: the kernel ends the listener's watch, and the new file
                // made by the pass right after may get the old one's inode number.
                try writer.clearMessageContents(forIdentifier: "note")
                try writer.passMessageObject("round \(round)", identifier: "note")
                #expect(eventually { received.values.last == "round \(round)" }, "\(received.values)")
            }
            listener.cancel()
        }
    }

    #if os(Linux) || os(Android)
    @Test("A watch whose file went and could not be made again is tried again until it can, then wakes its handler")
    func brokenWatchIsRepaired() async throws {
        try await offThePool {
            let path = directory("watched")
            let mayCreate = Locked(true)
            let create: @Sendable () -> Void = {
                guard mayCreate.withLock({ $0 }), !FileManager.default.fileExists(atPath: path) else { return }
                _ = FileManager.default.createFile(atPath: path, contents: Data())
            }
            let calls = Collector<Int>()
            let observation = try InotifyMonitor.shared.observe(path: path, create: create) { calls.append(1) }
            defer { observation.cancel() }
            #expect(FileManager.default.fileExists(atPath: path))
            try Data("one".utf8).write(to: URL(fileURLWithPath: path))
            #expect(eventually { calls.count >= 1 })
            // Removed while it cannot be made again: the removal wakes the handler, and the watch is broken.
            mayCreate.withLock { $0 = false }
            let beforeRemoval = calls.count
            try FileManager.default.removeItem(atPath: path)
            #expect(eventually { calls.count > beforeRemoval })
            usleep(300_000)
            #expect(!FileManager.default.fileExists(atPath: path))
            // Tried again every 50 ms: once the file can be made, it is, and watched, and the handler woken.
            let beforeRepair = calls.count
            mayCreate.withLock { $0 = true }
            #expect(eventually { FileManager.default.fileExists(atPath: path) && calls.count > beforeRepair })
            let afterRepair = calls.count
            let handle = try #require(FileHandle(forWritingAtPath: path))
            try handle.write(contentsOf: Data("two".utf8))
            try handle.close()
            #expect(eventually { calls.count > afterRepair }, "the new file's writes wake the handler")
        }
    }
    #endif

    @Test("A poller's token waits for a writer's lock: fresh each poll while it is held, then the heads again")
    func pollingTokenUnderLock() async throws {
        try await offThePool {
            let files = try FileTransiting(directory: directory("wormhole"))
            _ = try files.writeMessage(Data("one".utf8), sender: "test", identifier: "note")
            let settled = try #require(files.changeToken(identifier: "note"))
            #expect(files.changeToken(identifier: "note") == settled)
            let writer = open(directory("wormhole/note.msg"), O_RDWR)
            #expect(writer >= 0 && flock(writer, LOCK_EX) == 0)
            let first = files.changeToken(identifier: "note")
            let second = files.changeToken(identifier: "note")
            #expect(first != settled && second != settled && first != second)
            flock(writer, LOCK_UN)
            close(writer)
            #expect(files.changeToken(identifier: "note") == settled)
            _ = try files.writeMessage(Data("two".utf8), sender: "test", identifier: "note")
            #expect(files.changeToken(identifier: "note") != settled)
            #expect(files.changeToken(identifier: "missing") == nil)
        }
    }

    @Test("With polling, passes from another wormhole wake the listener through the mailbox file")
    func pollingWatchesTheFile() async throws {
        try await offThePool {
            var polling = Wormhole.Configuration()
            polling.notification = .polling(interval: .milliseconds(5))
            let wormhole = try makeWormhole(polling)
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) {
                received.append($0.number)
            }
            let writer = try makeWormhole(polling)
            for number in 1...3 {
                try writer.passMessageObject(Tap(number: number), identifier: "button")
                #expect(eventually { received.values.last == number })
            }
            #expect(received.values == [1, 2, 3])
            // A poller makes no notification file, and no pass wrote one.
            #expect(contents(".notifications/mailbox.button") == nil)
            listener.cancel()
        }
    }

    @Test("A notifier on another directory is posted to after each pass")
    func notifierElsewhere() async throws {
        try await offThePool {
            let transiting = try FileTransiting(directory: directory("mailboxes"))
            let notifier = try DirectoryNotifier(directory: directory("elsewhere"))
            let wormhole = Wormhole(transiting: transiting, notifier: notifier)
            #expect(wormhole.notifier is DirectoryNotifier)
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) {
                received.append($0.number)
            }
            try Wormhole(transiting: transiting, notifier: notifier).passMessageObject(
                Tap(number: 1),
                identifier: "button"
            )
            #expect(eventually { received.values == [1] })
            let token = FileManager.default.contents(atPath: directory("elsewhere/.notifications/mailbox.button"))
            #expect(token?.count == 8, "the pass posted")
            // The same directory, by another spelling of its path: the mailbox files wake listeners.
            let same = Wormhole(
                transiting: transiting,
                notifier: try DirectoryNotifier(directory: directory("mailboxes") + "/.")
            )
            #expect(same.notifier is MailboxFileNotifier)
            listener.cancel()
        }
    }
}
