import Foundation
import Testing

@testable import WormholeKit

/// Faults that need the operating system's help: another user, and a full disk. These run as root (as CI does),
/// which can switch to `nobody` with setpriv and mount a tiny tmpfs in a private mount namespace with unshare.
@Suite(
    "System faults",
    .limit(minutes: 3),
    .enabled(
        if: geteuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")
            && FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare"),
        "needs root, setpriv and unshare"
    )
)
struct SystemFaultTests {
    let directory = TemporaryDirectory()

    /// Runs a shell command line, returning its status and combined output.
    func shell(_ command: String) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", command]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    var tool: String { "'\(WormholeTool.path)'" }
    let asNobody = "setpriv --reuid=65534 --regid=65534 --clear-groups"

    @Test("Another user can neither read nor write a private wormhole")
    func otherUserIsKeptOut() async throws {
        try await offThePool {
            chmod(directory.path, 0o755)
            let wormhole = try Wormhole(directory: directory("private"))
            try wormhole.passMessageObject("secret", identifier: "a")
            let read = try shell("\(asNobody) \(tool) read --directory \(directory("private")) a")
            #expect(read.status != 0)
            #expect(read.output.contains("WormholeError"), "\(read.output)")
            let write = try shell("\(asNobody) \(tool) send --directory \(directory("private")) a '\"theirs\"'")
            #expect(write.status != 0)
            #expect(try wormhole.message(withIdentifier: "a", as: String.self) == "secret")
        }
    }

    @Test("A directory the process cannot write is refused at once with directoryUnavailable")
    func unwritableDirectory() async throws {
        try await offThePool {
            chmod(directory.path, 0o755)
            #expect(mkdir(directory("readonly"), 0o500) == 0)
            #expect(chown(directory("readonly"), 65534, 65534) == 0)
            let result = try shell("\(asNobody) \(tool) send --directory \(directory("readonly")) a 1")
            #expect(result.status != 0)
            #expect(result.output.contains("directory unavailable"), "\(result.output)")
            #expect(result.output.contains("not writable"), "\(result.output)")
        }
    }

    @Test("A full disk fails the pass with diskFull, keeps the previous message, and recovers once space is freed")
    func diskFull() async throws {
        try await offThePool {
            let mount = directory("small")
            #expect(mkdir(mount, 0o700) == 0)
            let large = "\"" + String(repeating: "x", count: 200_000) + "\""
            try large.write(toFile: directory("large.json"), atomically: true, encoding: .utf8)
            let script = """
                set -u
                mount -t tmpfs -o size=256k tmpfs \(mount) || exit 90
                \(tool) send --directory \(mount)/w a '"first"' || exit 91
                dd if=/dev/zero of=\(mount)/fill bs=4k count=1000 2>/dev/null
                \(tool) send --directory \(mount)/w a < \(directory("large.json")); echo "grow=$?"
                \(tool) send --directory \(mount)/w b '"new mailbox"'; echo "create=$?"
                \(tool) send --directory \(mount)/w a '"fits in place"'; echo "in-place=$?"
                \(tool) read --directory \(mount)/w a
                rm \(mount)/fill
                \(tool) send --directory \(mount)/w b '"after freeing"'; echo "freed=$?"
                \(tool) read --directory \(mount)/w b
                """
            let result = try shell("unshare -m sh -c '\(script.replacingOccurrences(of: "'", with: "'\\''"))'")
            #expect(result.status == 0, "\(result.output)")
            #expect(result.output.contains("grow=1"), "\(result.output)")
            #expect(result.output.contains("create=1"), "\(result.output)")
            #expect(result.output.contains("disk full"), "\(result.output)")
            // The mailbox's slots were allocated when it was made, so a message that fits still passes.
            #expect(result.output.contains("in-place=0"), "\(result.output)")
            #expect(result.output.contains("\"fits in place\""), "\(result.output)")
            #expect(result.output.contains("freed=0"), "\(result.output)")
            #expect(result.output.contains("\"after freeing\""), "\(result.output)")
        }
    }

    @Test("A shared group directory: two users of the group pass, listen, enqueue and send live; others are kept out")
    func sharedGroup() async throws {
        try await offThePool {
            chmod(directory.path, 0o755)
            let parent = directory("parent")
            #expect(mkdir(parent, 0o777) == 0)
            chmod(parent, 0o1777)  // like /tmp: anyone may create the wormhole directory in it
            let wormhole = parent + "/w"
            // Two members of group 4242 and a user outside it, each with the usual umask 022, which would leave files
            // group-read-only if the wormhole did not set their mode itself.
            let (a, b, outsider) = (
                "umask 022; setpriv --reuid=4001 --regid=4001 --groups=4242",
                "umask 022; setpriv --reuid=4002 --regid=4002 --groups=4242",
                "umask 022; setpriv --reuid=4003 --regid=4003 --clear-groups"
            )
            let shared = "--directory \(wormhole) --shared-group 4242"
            #expect(try shell("\(a) \(tool) send \(shared) note '\"from a\"'").status == 0)

            var status = stat()
            #expect(stat(wormhole, &status) == 0)
            #expect(status.st_mode & 0o7777 == 0o2770 && status.st_gid == 4242, "the directory is 2770, group 4242")
            #expect(stat(wormhole + "/note.msg", &status) == 0)
            #expect(status.st_mode & 0o7777 == 0o660 && status.st_gid == 4242 && status.st_uid == 4001)

            // b reads a's message; a listens while b passes (b's first message replaces the empty mailbox file that
            // a's listener made, so `reply.msg` is b's; a still creates its notification file, group 4242).
            let read = try shell("\(b) \(tool) read \(shared) note")
            #expect(read.status == 0 && read.output.contains("from a"), "\(read.output)")
            let listened = try shell(
                "(\(a) \(tool) listen \(shared) reply --count 1 --timeout 20 &) ; sleep 1; "
                    + "\(b) \(tool) send \(shared) reply '\"from b\"'; sleep 2"
            )
            #expect(listened.output.contains("from b"), "\(listened.output)")
            #expect(stat(wormhole + "/.notifications/mailbox.reply", &status) == 0)
            #expect(status.st_mode & 0o7777 == 0o660 && status.st_gid == 4242, "the listener's notification file")

            // A queue: b enqueues, a consumes (a's consumer position, b's log).
            #expect(try shell("\(b) \(tool) enqueue \(shared) jobs '{\"n\":1}'").status == 0)
            let consumed = try shell("\(a) \(tool) consume \(shared) jobs --consumer a --count 1 --timeout 20")
            #expect(consumed.status == 0 && consumed.output.contains("\"n\":1"), "\(consumed.output)")
            #expect(stat(wormhole + "/jobs.consumers", &status) == 0)
            #expect(status.st_mode & 0o7777 == 0o2770 && status.st_gid == 4242)

            // Live: b sends to a listening socket of a's.
            let live = try shell(
                "(\(a) \(tool) live-listen \(shared) ping --count 1 --timeout 20 &) ; sleep 1; "
                    + "\(b) \(tool) live-send \(shared) ping '\"hi\"'; sleep 2"
            )
            #expect(live.output.contains("hi"), "\(live.output)")
            #expect(stat(wormhole + "/.live", &status) == 0)
            #expect(status.st_mode & 0o7777 == 0o2770 && status.st_gid == 4242)

            // Outside the group: neither read, nor write, nor list.
            let outsiderRead = try shell("\(outsider) \(tool) read \(shared) note")
            #expect(outsiderRead.status != 0)
            #expect(outsiderRead.output.contains("WormholeError") || outsiderRead.output.contains("not writable"))
            #expect(try shell("\(outsider) \(tool) send \(shared) note '\"theirs\"'").status != 0)
            #expect(try shell("\(outsider) ls \(wormhole)").status != 0)
            // A private wormhole (no --shared-group) refuses the other member's files as planted.
            let strict = try shell("\(a) \(tool) read --directory \(wormhole) reply")
            #expect(strict.status != 0, "\(strict.output)")
            #expect(try shell("\(a) \(tool) read \(shared) note").output.contains("from a"))
        }
    }
}
