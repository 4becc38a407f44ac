import Foundation
import Synchronization
import Testing

@testable import WormholeKit

@Suite("File transiting")
struct FileTransitingTests {
    let directory = TemporaryDirectory()

    func transiting(_ options: FileTransiting.Options = .init()) throws -> FileTransiting {
        try FileTransiting(directory: directory("wormhole"), options: options)
    }

    @Test("Writes, reads, lists, clears; sequences grow across clearing")
    func basics() async throws {
        try await offThePool {
            let files = try transiting()
            #expect(try files.readMessage(identifier: "a") == nil)
            let first = try files.writeMessage(Data("1".utf8), sender: "test", identifier: "a")
            let second = try files.writeMessage(Data("2".utf8), sender: "test", identifier: "a")
            _ = try files.writeMessage(Data("x".utf8), sender: "test", identifier: "b")
            #expect(first.sequence == 1 && second.sequence == 2 && second.generation == first.generation)
            let read = try #require(try files.readMessage(identifier: "a"))
            #expect(read == second)
            #expect(try files.identifiers() == ["a", "b"])
            try files.deleteMessage(identifier: "a")
            #expect(try files.readMessage(identifier: "a") == nil)
            #expect(try files.identifiers() == ["b"])
            let third = try files.writeMessage(Data("3".utf8), sender: "test", identifier: "a")
            #expect(third.sequence == 4, "the cleared record took sequence 3")
            try files.deleteAllMessages()
            #expect(try files.identifiers() == [])
            try files.deleteMessage(identifier: "never-written")
        }
    }

    @Test("Hidden files left by a process killed before its rename are removed on opening, and no others")
    func abandonedTemporaryFiles() async throws {
        try await offThePool {
            let files = try transiting()
            let root = files.directory
            // A process that ran and is gone: its id names no process now.
            let child = Process()
            child.executableURL = URL(fileURLWithPath: "/bin/true")
            try child.run()
            child.waitUntilExit()
            let gone = child.processIdentifier
            let old = Date(timeIntervalSinceNow: -7200)
            let abandoned = ".tmp-\(gone)-1"
            let recent = ".tmp-\(gone)-2"  // an hour has not passed: its writer may be paused
            let living = ".tmp-\(getpid())-3"  // its process is there
            let notOurs = ".tmp-\(gone)-notes"  // not a name the wormhole writes
            for name in [abandoned, recent, living, notOurs] {
                #expect(FileManager.default.createFile(atPath: root + "/" + name, contents: Data("x".utf8)))
            }
            for name in [abandoned, living, notOurs] {
                try FileManager.default.setAttributes([.modificationDate: old], ofItemAtPath: root + "/" + name)
            }
            _ = try FileTransiting(directory: root)
            let left = try FileManager.default.contentsOfDirectory(atPath: root)
            #expect(!left.contains(abandoned))
            #expect(left.contains(recent))
            #expect(left.contains(living))
            #expect(left.contains(notOurs))
            #expect(DirectoryHandle.processOfTemporaryFile(".tmp-42-18446744073709551615") == 42)
            for name in [
                ".tmp-0-1", ".tmp--5-1", ".tmp-+5-1", ".tmp-05-1", ".tmp-5-", ".tmp-5-1-2", ".tmp-5", "tmp-5-1",
            ] {
                #expect(DirectoryHandle.processOfTemporaryFile(name) == nil, "\(name)")
            }
        }
    }

    @Test("Directories are created 0700 and files 0600")
    func permissionsArePrivate() async throws {
        try await offThePool {
            let files = try transiting()
            _ = try files.writeMessage(Data("1".utf8), sender: "test", identifier: "a")
            #expect(permissions(directory("wormhole")) == 0o700)
            #expect(permissions(directory("wormhole/a.msg")) == 0o600)
        }
    }

    @Test("Messages that outgrow their slots move to a larger file, keeping sequence and generation")
    func growth() async throws {
        try await offThePool {
            let files = try transiting()
            let small = try files.writeMessage(Data("1".utf8), sender: "test", identifier: "a")
            let large = Data(repeating: 0x41, count: 100_000)
            let grown = try files.writeMessage(large, sender: "test", identifier: "a")
            #expect(grown.sequence == small.sequence + 1 && grown.generation == small.generation)
            #expect(try files.readMessage(identifier: "a")?.payload == large)
            let after = try files.writeMessage(Data("2".utf8), sender: "test", identifier: "a")
            #expect(try files.readMessage(identifier: "a") == after)
        }
    }

    @Test("A sender over 65,535 bytes is stored cut to 65,535, in a new file, in place and in a grown one")
    func longSender() async throws {
        try await offThePool {
            let files = try transiting()
            let sender = String(repeating: "s", count: 70_000)
            let stored = String(repeating: "s", count: Int(UInt16.max))
            let first = try files.writeMessage(Data("1".utf8), sender: sender, identifier: "a")  // a new file
            #expect(first.sender == sender)
            #expect(try files.readMessage(identifier: "a")?.sender == stored)
            _ = try files.writeMessage(Data("2".utf8), sender: sender, identifier: "a")  // in place
            #expect(try files.readMessage(identifier: "a")?.sender == stored)
            let large = Data(repeating: 0x41, count: 200_000)
            _ = try files.writeMessage(large, sender: sender, identifier: "a")  // a grown file
            let read = try files.readMessage(identifier: "a")
            #expect(read?.sender == stored)
            #expect(read?.payload == large)
        }
    }

    @Test("A limit raised past 1 GiB still refuses a message a mailbox file cannot hold")
    func formatLimit() async throws {
        try await offThePool {
            let files = try transiting(FileTransiting.Options(maximumMessageSize: Int.max))
            let huge = Data(count: FileTransiting.largestMessageSize + 1)  // zero pages, never touched
            let error = #expect(throws: WormholeError.self) {
                try files.writeMessage(huge, sender: "test", identifier: "a")
            }
            #expect(error?.code == .messageTooLarge)
            #expect(error?.message.contains("1 GiB") == true)
            #expect(try files.readMessage(identifier: "a") == nil)
        }
    }

    @Test("A message over the size limit is refused and the previous one kept")
    func tooLarge() async throws {
        try await offThePool {
            let files = try transiting(.init(maximumMessageSize: 1000))
            _ = try files.writeMessage(Data("kept".utf8), sender: "test", identifier: "a")
            let error = #expect(throws: WormholeError.self) {
                try files.writeMessage(Data(count: 1001), sender: "test", identifier: "a")
            }
            #expect(error?.code == .messageTooLarge)
            #expect(try files.readMessage(identifier: "a")?.payload == Data("kept".utf8))
        }
    }

    @Test("A symbolic link planted as a mailbox is refused, and its target is never written")
    func plantedSymlink() async throws {
        try await offThePool {
            let files = try transiting()
            let outside = directory("outside.txt")
            try Data("secret".utf8).write(to: URL(fileURLWithPath: outside))
            #expect(symlink(outside, directory("wormhole/a.msg")) == 0)
            let writeError = #expect(throws: WormholeError.self) {
                try files.writeMessage(Data("1".utf8), sender: "test", identifier: "a")
            }
            #expect(writeError?.code == .untrustedFile)
            let readError = #expect(throws: WormholeError.self) { try files.readMessage(identifier: "a") }
            #expect(readError?.code == .untrustedFile)
            #expect(try String(contentsOfFile: outside, encoding: .utf8) == "secret")
        }
    }

    @Test("A hard link planted as a mailbox is refused")
    func plantedHardLink() async throws {
        try await offThePool {
            let files = try transiting()
            let outside = directory("outside.txt")
            try Data("secret".utf8).write(to: URL(fileURLWithPath: outside))
            #expect(link(outside, directory("wormhole/a.msg")) == 0)
            let error = #expect(throws: WormholeError.self) {
                try files.writeMessage(Data("1".utf8), sender: "test", identifier: "a")
            }
            #expect(error?.code == .untrustedFile)
            #expect(try String(contentsOfFile: outside, encoding: .utf8) == "secret")
        }
    }

    @Test("A FIFO or a directory planted as a mailbox is refused without blocking")
    func plantedSpecialFiles() async throws {
        try await offThePool {
            let files = try transiting()
            #expect(mkfifo(directory("wormhole/fifo.msg"), 0o600) == 0)
            #expect(mkdir(directory("wormhole/dir.msg"), 0o700) == 0)
            for identifier in ["fifo", "dir"] {
                let error = #expect(throws: WormholeError.self) { try files.readMessage(identifier: identifier) }
                #expect(error != nil)
                #expect(throws: WormholeError.self) {
                    try files.writeMessage(Data("1".utf8), sender: "test", identifier: identifier)
                }
            }
        }
    }

    @Test("A file of another user is refused as planted", .enabled(if: geteuid() == 0, "needs root to chown"))
    func otherOwner() async throws {
        try await offThePool {
            let files = try transiting()
            _ = try files.writeMessage(Data("1".utf8), sender: "test", identifier: "a")
            #expect(chown(directory("wormhole/a.msg"), 65534, 65534) == 0)
            let error = #expect(throws: WormholeError.self) { try files.readMessage(identifier: "a") }
            #expect(error?.code == .untrustedFile)
        }
    }

    @Test("A directory of another user is refused", .enabled(if: geteuid() == 0, "needs root to chown"))
    func otherOwnerDirectory() async throws {
        try await offThePool {
            #expect(mkdir(directory("theirs"), 0o700) == 0)
            #expect(chown(directory("theirs"), 65534, 65534) == 0)
            let error = #expect(throws: WormholeError.self) { try FileTransiting(directory: directory("theirs")) }
            #expect(error?.code == .untrustedFile)
        }
    }

    @Test("A missing directory is an error when it is not to be created; a file in the way is one too")
    func missingDirectory() async throws {
        try await offThePool {
            let missing = #expect(throws: WormholeError.self) {
                try FileTransiting(directory: directory("missing"), createDirectory: false)
            }
            #expect(missing?.code == .directoryUnavailable)
            try Data().write(to: URL(fileURLWithPath: directory("plain-file")))
            let notDirectory = #expect(throws: WormholeError.self) {
                try FileTransiting(directory: directory("plain-file/wormhole"))
            }
            #expect(notDirectory?.code == .directoryUnavailable)
        }
    }

    @Test("An unwritable directory is reported at once", .enabled(if: geteuid() != 0, "root writes anywhere"))
    func unwritableDirectory() async throws {
        try await offThePool {
            #expect(mkdir(directory("locked"), 0o500) == 0)
            let error = #expect(throws: WormholeError.self) { try FileTransiting(directory: directory("locked")) }
            #expect(error?.code == .directoryUnavailable)
        }
    }

    @Test("Damaged files give typed errors; the next write replaces them, but never a newer version's file")
    func damagedFiles() async throws {
        try await offThePool {
            let files = try transiting()
            let path = directory("wormhole/a.msg")
            let cases: [(String, [UInt8], WormholeError.Code)] = [
                ("empty", [], .truncatedMessage),
                (
                    "garbage", Array("this is not a wormhole file, just some text.......................".utf8),
                    .corruptMessage
                ),
                ("future version", Self.fileWithVersion(7), .unsupportedFormatVersion),
            ]
            for (name, bytes, code) in cases {
                try Data(bytes).write(to: URL(fileURLWithPath: path))
                chmod(path, 0o600)
                let error = #expect(throws: WormholeError.self, "\(name)") { try files.readMessage(identifier: "a") }
                #expect(error?.code == code, "\(name)")
                #expect(try files.identifiers() == ["a"], "a damaged mailbox is still listed")
                if code == .unsupportedFormatVersion {
                    // A newer writer's file is not damaged: it is kept for the processes that read it.
                    let refused = #expect(throws: WormholeError.self) {
                        try files.writeMessage(Data("fresh".utf8), sender: "test", identifier: "a")
                    }
                    #expect(refused?.code == .unsupportedFormatVersion)
                    #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == Data(bytes))
                    try FileManager.default.removeItem(atPath: path)
                    continue
                }
                let written = try files.writeMessage(Data("fresh".utf8), sender: "test", identifier: "a")
                #expect(try files.readMessage(identifier: "a") == written, "\(name)")
            }
            // Truncated in the slots: shorter than the header says.
            _ = try files.writeMessage(Data("1".utf8), sender: "test", identifier: "a")
            #expect(truncate(path, 200) == 0)
            let error = #expect(throws: WormholeError.self) { try files.readMessage(identifier: "a") }
            #expect(error?.code == .truncatedMessage)
        }
    }

    @Test("Clearing every mailbox clears each it can and keeps one of another version, failing with its error after")
    func clearAllKeepsAnotherVersion() async throws {
        try await offThePool {
            let files = try transiting()
            for identifier in ["a", "c"] {
                _ = try files.writeMessage(Data(identifier.utf8), sender: "test", identifier: identifier)
            }
            // Sorted between the two: a clear that stopped at it would leave "c" as it was.
            let newer = directory("wormhole/b.msg")
            let bytes = Self.fileWithVersion(7)
            try Data(bytes).write(to: URL(fileURLWithPath: newer))
            chmod(newer, 0o600)
            let refused = #expect(throws: WormholeError.self) { try files.deleteAllMessages() }
            #expect(refused?.code == .unsupportedFormatVersion, "\(String(describing: refused))")
            #expect(refused?.identifier == "b")
            #expect(try files.readMessage(identifier: "a") == nil)
            #expect(try files.readMessage(identifier: "c") == nil)
            #expect(try Data(contentsOf: URL(fileURLWithPath: newer)) == Data(bytes))
        }
    }

    @Test("A mailbox file of a newer format version is refused, not overwritten")
    func newerVersionIsKept() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: directory("wormhole"))
            try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
            let file = directory("wormhole/button.msg")
            var bytes = try Data(contentsOf: URL(fileURLWithPath: file))
            bytes[4] = 2  // the format version, little-endian, after the magic
            try bytes.write(to: URL(fileURLWithPath: file))
            let error = #expect(throws: WormholeError.self) {
                try wormhole.passMessageObject(Tap(number: 2), identifier: "button")
            }
            #expect(error?.code == .unsupportedFormatVersion)
            #expect(try Data(contentsOf: URL(fileURLWithPath: file)) == bytes, "the newer writer's file is unchanged")
        }
    }

    static func fileWithVersion(_ version: UInt16) -> [UInt8] {
        var bytes = MailboxFormat.encodeFile(
            header: .init(slotCapacity: 512, generation: 1),
            record: .init(sequence: 1, timestampNanoseconds: 0, isCleared: false, sender: [], payload: [1])
        )
        bytes.store(version, at: 4)
        return bytes
    }

    @Test("Each message read keeps its own sender, when senders of the same length alternate and when one is empty")
    func sendersAlternate() async throws {
        try await offThePool {
            let files = try transiting()
            let senders = ["ab", "ac", "", "ab", "a much longer sender name, past fifteen bytes", "ab"]
            for (index, sender) in senders.enumerated() {
                _ = try files.writeMessage(Data([UInt8(index)]), sender: sender, identifier: "a")
                let read = try #require(try files.readMessage(identifier: "a"))
                #expect(read.sender == sender, "message \(index)")
                #expect(read.payload == Data([UInt8(index)]))
            }
        }
    }

    @Test("Reused read memory: callers on many threads at once each get memory of their own")
    func scratchMemoryIsNeverShared() async throws {
        try await offThePool {
            let sizes = [1, 1_088, ScratchMemory.keptByteCount, ScratchMemory.keptByteCount + 1]
            let failures = Atomic<Int>(0)
            DispatchQueue.concurrentPerform(iterations: 8) { thread in
                for round in 0..<2_000 {
                    let size = sizes[(thread + round) % sizes.count]
                    ScratchMemory.withBytes(size) { buffer in
                        if buffer.count != size { failures.add(1, ordering: .relaxed) }
                        let mark = UInt8(truncatingIfNeeded: thread &* 31 &+ round)
                        buffer.initializeMemory(as: UInt8.self, repeating: mark)
                        if round % 64 == 0 { sched_yield() }
                        if !buffer.allSatisfy({ $0 == mark }) { failures.add(1, ordering: .relaxed) }
                    }
                }
            }
            #expect(failures.load(ordering: .relaxed) == 0)
        }
    }

    @Test("Writers on many threads never tear a message and never lose the sequence")
    func concurrentWriters() async throws {
        let files = try transiting()
        let threads = 4
        let perThread = 300
        await withTaskGroup(of: Void.self) { group in
            for thread in 0..<threads {
                group.addTask {
                    for index in 0..<perThread {
                        let payload = Data("\(thread)-\(index)-".utf8) + Data(repeating: UInt8(thread), count: index)
                        _ = try? files.writeMessage(payload, sender: "t\(thread)", identifier: "shared")
                        if let read = try? files.readMessage(identifier: "shared") {
                            let text = String(
                                decoding: read.payload.prefix(while: { $0 != UInt8(ascii: "-") }),
                                as: UTF8.self
                            )
                            #expect(Int(text) != nil)
                            // The sender is the writer's own (each read may find another thread's message).
                            #expect(read.sender == "t\(text)")
                        }
                    }
                }
            }
        }
        #expect(try files.readMessage(identifier: "shared")?.sequence == UInt64(threads * perThread))
    }
}
