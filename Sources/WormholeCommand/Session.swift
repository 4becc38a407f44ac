import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

struct SessionCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "session",
        abstract: "Talk to a counterpart through a session, as WatchConnectivity's WCSession does.",
        discussion: """
            Each side names itself (--as) and its counterpart (--counterpart); the other side uses the same two \
            names the other way round. A context, user info and files wait for the counterpart; a message needs it \
            there (`session watch` on the other side). Every command activates the session for as long as it runs.
            """,
        subcommands: [
            SessionContext.self, SessionSend.self, SessionTransferUserInfo.self, SessionTransferFile.self,
            SessionWatch.self,
        ]
    )
}

/// `--as` and `--counterpart`, and the session they make.
struct SessionNames: ParsableArguments {
    @Option(name: .customLong("as"), help: "This side's name (letters, digits, '-', '_').")
    var name: String

    @Option(help: "The counterpart's name.")
    var counterpart: String

    func makeSession(_ location: LocationOptions, receivingFilesInto into: String? = nil) throws -> WormholeSession {
        try WormholeSession(
            wormhole: try location.makeWormhole(sender: name),
            name: name,
            counterpart: counterpart,
            receivedFilesDirectory: into
        )
    }
}

/// One JSON line, keys sorted.
private func sessionLine(_ fields: [String: JSONValue]) -> String { Output.objectLine(fields) }

/// A JSON object given on the command line.
private func jsonObject(_ text: String?, what: String) throws -> [String: JSONValue] {
    let data = try validatedJSON(text, what: what)
    guard let object = try? JSONDecoder().decode([String: JSONValue].self, from: data) else {
        throw Output.fail("the \(what) must be a JSON object, such as {\"key\": 1}; nothing was done", status: 2)
    }
    return object
}

struct SessionContext: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "context",
        abstract: "Set the application context sent to the counterpart, or print the one received.",
        discussion: """
            With a JSON object, replaces the context the counterpart receives when it next activates, even after \
            this command has exited. Without one, prints the context last received from the counterpart, and with \
            --sent the one last sent.
            """
    )
    @OptionGroup var location: LocationOptions
    @OptionGroup var names: SessionNames
    @Argument(help: "The new context, a JSON object.") var json: String?
    @Flag(help: "Print the context last sent instead of the one received.") var sent = false

    func run() throws {
        let session = try names.makeSession(location)
        guard let json else {
            let context = sent ? try session.applicationContext : try session.receivedApplicationContext
            Output.line(sessionLine(context))
            return
        }
        let context = try jsonObject(json, what: "context")
        try session.activate()
        defer { session.deactivate() }
        try session.updateApplicationContext(context)
    }
}

struct SessionSend: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "send",
        abstract: "Send a message to the counterpart and print its reply.",
        discussion: """
            Exits with status 1 and a message on standard error when the counterpart is not reachable (its session \
            is not activated), has never activated, fails, or does not reply in time.
            """
    )
    @OptionGroup var location: LocationOptions
    @OptionGroup var names: SessionNames
    @Argument(help: "The message, a JSON object. Read from standard input when left out.") var json: String?
    @Option(help: "Seconds to wait for the reply.") var timeout: Double = 10
    @Flag(help: "Ask for no reply: the counterpart's handlers only receive it.") var noReply = false

    func validate() throws {
        guard timeout > 0, timeout <= 86_400 else { throw ValidationError("--timeout must be between 0 and 86400.") }
    }

    func run() throws {
        let message = try jsonObject(json, what: "message")
        let session = try names.makeSession(location)
        try session.activate()
        defer { session.deactivate() }
        let outcome = Locked<Result<[String: JSONValue], WormholeError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        let timeout = Duration.milliseconds(Int(timeout * 1000))
        let expectsReply = !noReply
        Task {
            do throws(WormholeError) {
                let reply = try await session.sendMessage(message, expectsReply: expectsReply, timeout: timeout)
                outcome.withLock { $0 = .success(reply) }
            } catch {
                outcome.withLock { $0 = .failure(error) }
            }
            done.signal()
        }
        done.wait()
        switch outcome.withLock({ $0 })! {
        case .success(let reply): Output.line(sessionLine(reply))
        case .failure(let error): throw Output.fail("\(error)")
        }
    }
}

struct SessionTransferUserInfo: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "transfer-user-info",
        abstract: "Queue a JSON object for the counterpart (in order, once), list the outstanding ones, or cancel one.",
        discussion: "Prints the transfer id. With --list, prints one JSON line per transfer not yet received."
    )
    @OptionGroup var location: LocationOptions
    @OptionGroup var names: SessionNames
    @Argument(help: "The user info, a JSON object.") var json: String?
    @Flag(help: "Send it as the current complication info: it replaces a current one not yet received.")
    var current = false
    @Flag(help: "List the transfers the counterpart has not received yet.") var list = false
    @Option(help: "Cancel the transfer with this id; exit status 1 if it was received already.") var cancel: String?

    func run() throws {
        let session = try names.makeSession(location)
        if list {
            for transfer in try session.outstandingUserInfoTransfers {
                Output.line(
                    sessionLine([
                        "id": .string(transfer.id), "userInfo": .object(transfer.userInfo),
                        "current": .bool(transfer.isCurrentComplicationInfo),
                    ])
                )
            }
            return
        }
        if let cancel {
            let known = try session.outstandingUserInfoTransfers.first { $0.id == cancel }
            guard let known, try session.cancelUserInfoTransfer(known) else {
                throw Output.fail("user info transfer \(cancel) was received already, or is unknown")
            }
            return
        }
        let userInfo = try jsonObject(json, what: "user info")
        try session.activate()
        defer { session.deactivate() }
        let transfer =
            current
            ? try session.transferCurrentComplicationUserInfo(userInfo) : try session.transferUserInfo(userInfo)
        Output.line(transfer.id)
    }
}

struct SessionTransferFile: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "transfer-file",
        abstract:
            "Queue a file for the counterpart (delivered once, resumable), list the outstanding ones, or cancel one.",
        discussion: "Prints the transfer id; a progress bar goes to standard error while the file is copied."
    )
    @OptionGroup var location: LocationOptions
    @OptionGroup var names: SessionNames
    @Argument(help: "The file to send.") var file: String?
    @Option(help: "The name the counterpart gets it under.") var name: String?
    @Option(name: .customLong("meta"), help: "Metadata as KEY=VALUE (repeat for several).") var metadata: [String] = []
    @Flag(help: "List the transfers the counterpart has not received yet.") var list = false
    @Option(help: "Cancel the transfer with this id; exit status 1 if it was received already.") var cancel: String?
    @Flag(help: ArgumentHelp("Print the progress as lines on standard output instead of a bar.", visibility: .hidden))
    var progressLines = false

    func run() throws {
        let session = try names.makeSession(location)
        if list {
            for transfer in try session.outstandingFileTransfers {
                Output.line(
                    sessionLine([
                        "id": .string(transfer.id), "name": .string(transfer.name),
                        "size": .integer(Int64(transfer.size)),
                    ])
                )
            }
            return
        }
        if let cancel {
            let known = try session.outstandingFileTransfers.first { $0.id == cancel }
            guard let known, try session.cancelFileTransfer(known) else {
                throw Output.fail("file transfer \(cancel) was received already, or is unknown")
            }
            return
        }
        guard let file else { throw ValidationError("Give a file to send, or --list, or --cancel ID.") }
        var pairs: [String: String] = [:]
        for pair in metadata {
            guard let equals = pair.firstIndex(of: "=") else {
                throw ValidationError("--meta takes KEY=VALUE, not \(pair).")
            }
            pairs[String(pair[..<equals])] = String(pair[pair.index(after: equals)...])
        }
        try session.activate()
        defer { session.deactivate() }
        let bar = ProgressBar(asLines: progressLines)
        let transfer = try session.transferFile(file, name: name, metadata: pairs) { bar.show($0) }
        if !progressLines { FileHandle.standardError.write(Data("\n".utf8)) }
        Output.line(transfer.id)
    }
}

/// A progress bar on standard error, redrawn when the percentage changes; or, for the demo, which shows a child's
/// progress, a line on standard output at each quarter.
final class ProgressBar: Sendable {
    private let lastPercent = Locked(-1)
    private let asLines: Bool

    init(asLines: Bool = false) { self.asLines = asLines }

    func show(_ progress: TransferProgress) {
        let percent = Int(progress.fraction * 100)
        let shown = asLines ? percent / 25 * 25 : percent
        let changed = lastPercent.withLock { last in
            defer { last = shown }
            return last != shown
        }
        guard changed else { return }
        let filled = percent / 4
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: 25 - filled)
        if asLines {
            Output.line("progress [\(bar)] \(shown)%")
            return
        }
        let text = String(
            format: "\r[%@] %3d%% %.1f / %.1f MiB",
            bar,
            percent,
            Double(progress.bytesCopied) / 1_048_576,
            Double(progress.totalBytes) / 1_048_576
        )
        FileHandle.standardError.write(Data(text.utf8))
    }
}

struct SessionWatch: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Activate the session and print what the counterpart sends, one JSON line each.",
        discussion: """
            Prints {"event": "context" | "message" | "userInfo" | "file" | "reachable", …}. On activation, what \
            the counterpart sent while this side was away comes first: the newest context, then queued user info and \
            files. Messages are answered with --reply. --count counts contexts, messages, user info and files; the \
            session stops taking them at the count. \
            "watching NAME→COUNTERPART" goes to standard error when ready.
            """
    )
    @OptionGroup var location: LocationOptions
    @OptionGroup var names: SessionNames
    @Option(help: "The reply to each message, a JSON object.") var reply: String = "{}"
    @Option(help: "Where received files go (by default a directory of the session's in the temporary directory).")
    var into: String?
    @OptionGroup var limits: ListeningLimits

    func run() throws {
        let answer = try jsonObject(reply, what: "reply")
        let session = try names.makeSession(location, receivingFilesInto: into)
        // Printing and counting in one place, in order: each line is out before the event counts.
        let output = DispatchQueue(label: "wormhole.session.watch")
        try limits.listen(ready: "watching \(names.name)→\(names.counterpart)") { tally in
            @Sendable func print(_ fields: [String: JSONValue], counts: Bool = true) {
                Output.line(sessionLine(fields))
                guard counts else { return }
                tally.add()
                // Past --count, take nothing more: what comes next stays for the next command.
                if tally.isReached { session.deactivate() }
            }
            let handlers: [SessionListener] = [
                session.onApplicationContext(on: .queue(output)) { update in
                    print([
                        "event": "context", "context": .object(update.context),
                        "changed": .array(update.changedKeys.sorted().map { .string($0) }),
                    ])
                },
                session.onMessage(on: .queue(output)) { message in
                    print(["event": "message", "message": .object(message.message)])
                    if message.expectsReply { message.reply(answer) }
                },
                session.onUserInfo(on: .queue(output)) { transfer in
                    print([
                        "event": "userInfo", "id": .string(transfer.id), "userInfo": .object(transfer.userInfo),
                        "current": .bool(transfer.isCurrentComplicationInfo),
                    ])
                },
                session.onFile(on: .queue(output)) { file in
                    print([
                        "event": "file", "id": .string(file.transfer.id), "name": .string(file.transfer.name),
                        "path": .string(file.path), "size": .integer(Int64(file.transfer.size)),
                        "metadata": .object(file.transfer.metadata.mapValues { .string($0) }),
                    ])
                },
                session.onReachabilityChange(on: .queue(output)) { reachable in
                    print(["event": "reachable", "reachable": .bool(reachable)], counts: false)
                },
                session.onError(on: .queue(output)) { error in Output.error("\(error)") },
            ]
            try session.activate()
            return SessionWatchHandle(session: session, handlers: handlers)
        }
    }
}

/// What `session watch` stops when it is done: the handlers, then the session.
private final class SessionWatchHandle: WormholeCancellable {
    let session: WormholeSession
    let handlers: [SessionListener]
    init(session: WormholeSession, handlers: [SessionListener]) {
        self.session = session
        self.handlers = handlers
    }
    func cancel() {
        session.deactivate()
        for handler in handlers { handler.cancel() }
    }
    var isCancelled: Bool { session.activationState != .activated }
}
