// check-platform-calls: not read (the calls below are planted in trees of their own)
import Foundation
import Testing

/// `scripts/check-platform-calls`, which stands in for a Darwin compiler on the one mistake a Linux build cannot see:
/// a Linux-only call outside a Linux branch. It passes on the package, and fails on each kind of call planted in a
/// tree of its own, naming the file and line.
@Suite("The check for Linux-only calls outside Linux branches", .limit(minutes: 1))
struct PlatformCallCheckTests {
    /// The package's root: this file is Tests/WormholeTests/Platform/PlatformCallCheckTests.swift.
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().path

    struct Outcome {
        var status: Int32
        var output: String
    }

    /// Runs the check on `root`'s Sources and Tests.
    func check(root: String) throws -> Outcome {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", Self.packageRoot + "/scripts/check-platform-calls", "--root", root]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Outcome(status: process.terminationStatus, output: String(decoding: data, as: UTF8.self))
    }

    /// A tree with one file at `path` holding `text`.
    func tree(_ path: String, _ text: String, in directory: TemporaryDirectory) throws -> String {
        let root = directory("tree")
        let file = root + "/" + path
        try FileManager.default.createDirectory(
            atPath: (file as NSString).deletingLastPathComponent,
            withIntermediateDirectories: true
        )
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        return root
    }

    @Test("The package itself has no Linux-only call outside a Linux branch")
    func packagePasses() throws {
        let outcome = try check(root: Self.packageRoot)
        #expect(outcome.status == 0, "\(outcome.output)")
    }

    @Test(
        "A planted Linux-only call outside a Linux branch fails the check, with its file and line",
        arguments: [
            ("let watcher = inotify_init1(0)", "inotify_init1"),
            ("let kind = SOCK_SEQPACKET", "SOCK_SEQPACKET"),
            ("let status = try String(contentsOfFile: \"/proc/self/status\")", "/proc/"),
            ("_ = Glibc.write(1, nil, 0)", "Glibc"),
            ("let type = Int32(SOCK_STREAM.rawValue)", "SOCK_STREAM.rawValue"),
        ]
    )
    func plantedSwiftCall(line: String, token: String) throws {
        let directory = TemporaryDirectory()
        let text = "import Foundation\n\n#if canImport(Darwin)\nlet fine = 1\n#endif\n\(line)\n"
        let outcome = try check(root: try tree("Sources/WormholeKit/Planted.swift", text, in: directory))
        #expect(outcome.status == 1, "\(outcome.output)")
        #expect(outcome.output.contains("Sources/WormholeKit/Planted.swift:6: \(token)"), "\(outcome.output)")
    }

    @Test("The same calls pass inside a Linux branch, in the #else of a Darwin one, and in comments or strings")
    func linuxBranchesPass() throws {
        let directory = TemporaryDirectory()
        let text = """
            import Foundation
            #if os(Linux) || os(Android)
            let watcher = inotify_init1(0)
            #elseif canImport(Darwin)
            let watcher: Int32 = -1
            #endif
            #if canImport(Darwin)
            let kind = SOCK_STREAM
            #else
            let kind = Int32(SOCK_SEQPACKET.rawValue)
            #endif
            #if !(os(Linux) || os(Android))
            let none = 0
            #else
            let proc = "/proc/self/fd"
            #endif
            // inotify_init1 and SOCK_SEQPACKET in a comment are words, not calls
            let name = "fallocate"

            """
        let outcome = try check(root: try tree("Sources/WormholeKit/Fine.swift", text, in: directory))
        #expect(outcome.status == 0, "\(outcome.output)")
    }

    @Test("A planted Linux call in C outside `#if defined(__linux__)` fails the check")
    func plantedCCall() throws {
        let directory = TemporaryDirectory()
        let text = """
            #include <stddef.h>
            #if defined(__linux__)
            int fine(void) { return epoll_create1(0); }
            #endif
            int planted(void) { return epoll_create1(0); }

            """
        let outcome = try check(root: try tree("Sources/CWormholeSystem/planted.c", text, in: directory))
        #expect(outcome.status == 1, "\(outcome.output)")
        #expect(outcome.output.contains("Sources/CWormholeSystem/planted.c:5: epoll_create1"), "\(outcome.output)")
    }
}
