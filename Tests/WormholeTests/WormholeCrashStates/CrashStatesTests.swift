import Foundation
import Testing
import WormholeCrashStates

/// The power-loss explorer's own parts: reading strace's output, following names and descriptors to files, and the
/// states a power cut may leave. Hand-made traces, so that each rule is checked alone.
@Suite("Crash states: traces and the model")
struct CrashStatesTests {
    @Test("strace lines: hex strings, descriptors with paths, deleted files, iovecs, calls split by another thread")
    func parsesStraceLines() async throws {
        try await offThePool {
            let trace = """
                100 openat(AT_FDCWD</r>, "\\x2f\\x72\\x2f\\x61", O_WRONLY|O_CREAT|O_APPEND|O_CLOEXEC, 0600) = 3</r/a>
                100 write(3</r/a>, "\\x68\\x69", 2) = 2
                101 pwrite64(3</r/a>, "\\x41\\x42\\x43" <unfinished ...>
                100 writev(3</r/a>, [{iov_base="\\x31", iov_len=1}, {iov_base="\\x32\\x33", iov_len=2}], 2) = 3
                101 <... pwrite64 resumed>, 3, 0) = 3
                100 close(3</r/a>(deleted)) = 0
                100 write(-1, "\\x64\\x6f\\x6e\\x65", 4) = -1 EBADF (Bad file descriptor)
                102 ???( <detached ...>
                103 fsync(4</r/b> <unfinished ...>
                103 ???( <detached ...>
                100 +++ exited with 0 +++
                """
            let calls = try SystemCallTrace.parse(trace)
            #expect(calls.map(\.name) == ["openat", "write", "writev", "pwrite64", "close", "write"])
            #expect(calls[0].resultPath == "/r/a")
            #expect(calls[0].arguments[1].bytes == Array("/r/a".utf8))
            #expect(calls[0].arguments[2].words == ["O_WRONLY", "O_CREAT", "O_APPEND", "O_CLOEXEC"])
            #expect(calls[3].arguments[1].bytes == Array("ABC".utf8) && calls[3].arguments[3].number == 0)
            #expect(calls[4].arguments[0].path == "/r/a")
            #expect(calls[5].result == -1)
            // A string cut short by strace's -s would make writes wrong: it is refused.
            #expect(throws: TraceError.self) { try SystemCallTrace.parse(#"1 write(3</r/a>, "\x41"..., 5) = 5"#) }
        }
    }

    @Test("Names and descriptors: appends, truncation, renames over files, links, markers; outside the root ignored")
    func followsFiles() async throws {
        try await offThePool {
            let trace = """
                1 mkdir("\\x2f\\x72\\x2f\\x64", 0700) = 0
                1 openat(AT_FDCWD</r>, "\\x2f\\x72\\x2f\\x64\\x2f\\x6c\\x6f\\x67", O_WRONLY|O_CREAT|O_APPEND, 0600) = 3</r/d/log>
                1 write(3</r/d/log>, "\\x61\\x62", 2) = 2
                1 write(3</r/d/log>, "\\x63", 1) = 1
                1 openat(4</r/d>, "\\x74\\x6d\\x70", O_WRONLY|O_CREAT|O_EXCL, 0600) = 5</r/d/tmp>
                1 pwrite64(5</r/d/tmp>, "\\x78\\x79", 2, 0) = 2
                1 fsync(5</r/d/tmp>) = 0
                1 renameat(4</r/d>, "\\x74\\x6d\\x70", 4</r/d>, "\\x6c\\x6f\\x67") = 0
                1 write(3</r/d/log>(deleted), "\\x64", 1) = 1
                1 openat(AT_FDCWD</r>, "\\x2f\\x72\\x2f\\x64\\x2f\\x6c\\x6f\\x67", O_RDWR|O_TRUNC) = 6</r/d/log>
                1 write(-1, "\\x6d", 1) = -1 EBADF (Bad file descriptor)
                1 openat(AT_FDCWD</r>, "\\x2f\\x65\\x74\\x63\\x2f\\x78", O_WRONLY|O_CREAT, 0600) = 7</etc/x>
                1 write(7</etc/x>, "\\x7a", 1) = 1
                """
            let operations = try FileOperations(calls: try SystemCallTrace.parse(trace), root: "/r").operations
            #expect(
                operations == [
                    .makeDirectory(parent: 0, name: "d", inode: 1),
                    .create(parent: 1, name: "log", inode: 2),
                    .write(inode: 2, offset: 0, bytes: Array("ab".utf8), extends: true),
                    .write(inode: 2, offset: 2, bytes: Array("c".utf8), extends: true),
                    .create(parent: 1, name: "tmp", inode: 3),
                    .write(inode: 3, offset: 0, bytes: Array("xy".utf8), extends: true),
                    .synchronize(inode: 3),
                    .rename(fromParent: 1, fromName: "tmp", toParent: 1, toName: "log"),
                    // Through the old descriptor: the replaced file, no longer named.
                    .write(inode: 2, offset: 3, bytes: Array("d".utf8), extends: true),
                    .truncate(inode: 3, size: 0),
                    .marker("m"),
                ]
            )
            // A trace that uses a file the directory did not start with cannot be followed.
            #expect(throws: TraceError.self) {
                try FileOperations(
                    calls: try SystemCallTrace.parse(
                        #"1 openat(AT_FDCWD</r>, "\x2f\x72\x2f\x7a", O_RDONLY) = 3</r/z>"#
                    ),
                    root: "/r"
                )
            }
        }
    }

    @Test("What a power cut keeps: every durable change, a prefix of directory changes, a prefix of size changes")
    func statesFollowTheModel() async throws {
        try await offThePool {
            // A file made and filled, flushed, renamed into place; then an append to it, not flushed.
            let operations = FileOperations(operations: [
                .create(parent: 0, name: "tmp", inode: 1),
                .write(inode: 1, offset: 0, bytes: [UInt8](repeating: 1, count: 1024), extends: true),
                .synchronize(inode: 1),
                .rename(fromParent: 0, fromName: "tmp", toParent: 0, toName: "file"),
                .synchronize(inode: 0),
                .marker("durable"),
                .write(inode: 1, offset: 1024, bytes: [UInt8](repeating: 2, count: 1100), extends: true),
                .write(inode: 1, offset: 0, bytes: [UInt8](repeating: 3, count: 10), extends: false),
            ])
            let states = CrashStates(operations)
            #expect(states.crashPoints == [2, 4, 5, 8])
            var generator = SystemRandomNumberGenerator()
            let end = states.states(at: 8, budget: 1000, using: &generator)
            var sizes: Set<Int> = []
            for state in end {
                // The rename was flushed: the file is always there under its name, whole up to 1,024 bytes.
                let inode = state.tree.entries[0]?["file"]
                #expect(inode == 1 && state.tree.entries[0]?["tmp"] == nil)
                let bytes = state.tree.contents[1] ?? []
                sizes.insert(bytes.count)
                #expect(bytes.count >= 1024)
                #expect(bytes.dropFirst(10).prefix(1014).allSatisfy { $0 == 1 })
                #expect(bytes.dropFirst(1024).allSatisfy { $0 == 2 })
            }
            // The append kept, dropped, or torn at the 512-byte boundaries inside it (1,536 and 2,048).
            #expect(sizes == [1024, 1536, 2048, 2124])
            // The in-place write kept or dropped (it is within one sector: never torn).
            #expect(Set(end.map { $0.tree.contents[1]?.first }) == [1, 3])
            // Before the directory was flushed, the rename may be lost: the file has its old name then.
            let early = states.states(at: 4, budget: 100, using: &generator)
            #expect(Set(early.map { $0.tree.entries[0]?.keys.sorted() ?? [] }) == [["tmp"], ["file"], []])
        }
    }
}
