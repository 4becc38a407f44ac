import ArgumentParser
import Foundation
import WormholeKit

/// The `wormhole` command-line tool.
@main
struct WormholeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "wormhole",
        abstract: "Pass messages between processes through a shared directory, with live notifications.",
        discussion: """
            Each command works on a wormhole directory, named either by an application group and an optional \
            subdirectory (--group, --optional-directory), under $WORMHOLE_APP_GROUPS or \
            ~/.local/share/app-groups, or by a path (--directory). Messages are JSON, so what the tool sends a \
            Swift program reads, and the reverse.

            Start with `wormhole demo`.
            """,
        version: "0.1.0",
        subcommands: [
            Send.self, Read.self, Listen.self, Clear.self, List.self, Enqueue.self, Consume.self,
            QueueStatusCommand.self, Request.self, Respond.self, LiveSend.self, LiveListen.self, Defaults.self,
            TransferCommand.self,
            StoreCommand.self,
            Demo.self, Bench.self,
            CrashTest.self, CrashVictim.self, DemoRole.self, BenchPeer.self, Exercise.self, ExerciseStore.self, DemoRoleStore.self, BenchPeerStore.self, BenchCase.self,
            BenchCasePeer.self,
        ]
    )
}

extension WormholeCommand {
    /// Runs the tool. A write to a pipe or socket whose reader is gone (a command that does not read its input, a
    /// closed `| head`) must fail that write, not kill the process: SIGPIPE is ignored.
    static func main() {
        signal(SIGPIPE, SIG_IGN)
        do {
            var command = try parseAsRoot()
            try command.run()
        } catch {
            exit(withError: error)
        }
    }
}

/// Where a command's wormhole lives.
struct LocationOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The application group identifier, such as group.com.example.app.", valueName: "id"))
    var group: String?

    @Option(name: .long, help: ArgumentHelp("A subdirectory of the group's container for the wormhole.", valueName: "name"))
    var optionalDirectory: String?

    @Option(name: .long, help: ArgumentHelp("An explicit wormhole directory, instead of a group.", valueName: "path"))
    var directory: String?

    @Flag(name: .long, help: "Coordinate with a directory-wide lock (CoordinatedFileTransiting).")
    var coordinated = false

    @Option(name: .long, help: ArgumentHelp("Poll for changes every N milliseconds instead of using inotify.", valueName: "ms"))
    var pollInterval: Int?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Share the wormhole with the users of a Unix group (a name or a number): directories 2770 and files "
                + "0660 of that group. Every process sharing it must pass the same group.",
            valueName: "group"))
    var sharedGroup: String?

    func validate() throws {
        switch (group, directory) {
        case (nil, nil): throw ValidationError("Name a wormhole with --group ID or --directory PATH.")
        case (_?, _?): throw ValidationError("Give --group or --directory, not both.")
        default: break
        }
        if optionalDirectory != nil && group == nil {
            throw ValidationError("--optional-directory goes with --group.")
        }
    }

    /// Opens the wormhole; `sender` names this process in the messages it passes (by default `wormhole[pid]`).
    func makeWormhole(sender: String? = nil) throws -> Wormhole {
        var configuration = Wormhole.Configuration()
        if let sender { configuration.sender = "\(sender)[\(ProcessInfo.processInfo.processIdentifier)]" }
        configuration.coordination = coordinated ? .coordinated : .none
        if let pollInterval { configuration.notification = .polling(interval: .milliseconds(pollInterval)) }
        if let sharedGroup { configuration.fileOptions = .shared(withGroup: try Self.groupID(sharedGroup)) }
        if let group {
            return try Wormhole(
                applicationGroupIdentifier: group, optionalDirectory: optionalDirectory, configuration: configuration)
        }
        return try Wormhole(directory: directory!, configuration: configuration)
    }

    /// The id of a Unix group given by name or number.
    static func groupID(_ group: String) throws -> UInt32 {
        if let number = UInt32(group) { return number }
        guard let entry = getgrnam(group) else {
            throw ValidationError("There is no Unix group named \(group); give a group name or number to --shared-group.")
        }
        return UInt32(entry.pointee.gr_gid)
    }

    /// The arguments that name the same wormhole in a child process.
    var arguments: [String] {
        var result: [String] = []
        if let group { result += ["--group", group] }
        if let optionalDirectory { result += ["--optional-directory", optionalDirectory] }
        if let directory { result += ["--directory", directory] }
        if coordinated { result.append("--coordinated") }
        if let pollInterval { result += ["--poll-interval", String(pollInterval)] }
        if let sharedGroup { result += ["--shared-group", sharedGroup] }
        return result
    }
}

/// Checks that a command-line message is JSON; returns its bytes.
func validatedJSON(_ argument: String?, what: String) throws -> Data {
    let text = argument.map { Data($0.utf8) } ?? FileHandle.standardInput.readDataToEndOfFile()
    let trimmed = Data(String(decoding: text, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).utf8)
    do {
        _ = try JSONSerialization.jsonObject(with: trimmed, options: [.fragmentsAllowed])
    } catch {
        throw Output.fail("the \(what) is not valid JSON, so nothing was done: \(error.localizedDescription)", status: 2)
    }
    return trimmed
}

/// Output helpers: whole lines, written straight to the descriptor so that each one is flushed at once.
enum Output {
    static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    static func error(_ text: String) {
        FileHandle.standardError.write(Data(("wormhole: " + text + "\n").utf8))
    }

    /// Exits with `status` after saying why on standard error.
    static func fail(_ text: String, status: Int32 = 1) -> ExitCode {
        error(text)
        return ExitCode(status)
    }

    /// Waits for `done`, up to `timeout` seconds when one is given; returns whether it came.
    static func wait(for done: DispatchSemaphore, timeout: Double?) -> Bool {
        guard let timeout else {
            done.wait()
            return true
        }
        return done.wait(timeout: .now() + timeout) == .success
    }

    /// A payload as one line of JSON: compact JSON as it is, other JSON re-serialised without newlines.
    static func jsonLine(_ payload: Data) -> String {
        if !payload.contains(UInt8(ascii: "\n")) { return String(decoding: payload, as: UTF8.self) }
        if let object = try? JSONSerialization.jsonObject(with: payload, options: [.fragmentsAllowed]),
            let compact = try? JSONSerialization.data(withJSONObject: object, options: [.fragmentsAllowed, .sortedKeys])
        {
            return String(decoding: compact, as: UTF8.self)
        }
        return String(decoding: payload, as: UTF8.self).replacingOccurrences(of: "\n", with: " ")
    }

    /// An envelope as one JSON object: sequence, generation, sender, time and the payload (as JSON when it is).
    static func envelopeLine(_ envelope: Envelope) -> String {
        let time = ISO8601DateFormatter.string(
            from: envelope.date, timeZone: .gmt, formatOptions: [.withInternetDateTime, .withFractionalSeconds])
        let payload = (try? JSONSerialization.jsonObject(with: envelope.payload, options: [.fragmentsAllowed])) != nil
            ? jsonLine(envelope.payload)
            : "\"" + envelope.payload.base64EncodedString() + "\""
        let sender = String(decoding: try! JSONEncoder().encode(envelope.sender), as: UTF8.self)
        return "{\"sequence\":\(envelope.sequence),\"generation\":\(envelope.generation),\"sender\":\(sender),"
            + "\"time\":\"\(time)\",\"payload\":\(payload)}"
    }
}
