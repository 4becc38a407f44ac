import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

struct Request: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send a JSON request to a process answering IDENTIFIER and print its reply.",
        discussion: """
            Exits with status 1 and a message on standard error when nobody answers, the time-out passes, or the \
            responder fails (or its process ends) before replying.
            """
    )

    @OptionGroup var location: LocationOptions

    @Argument(help: "The identifier the responder answers.")
    var identifier: String

    @Argument(help: "The request, as JSON. Read from standard input when left out.")
    var json: String?

    @Option(help: "Seconds to wait for the reply.")
    var timeout: Double = 5

    func run() throws {
        let payload = try validatedJSON(json, what: "request")
        let wormhole = try location.makeWormhole()
        let identifier = identifier
        let timeout = timeout
        let result = Locked<Result<Data, WormholeError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task {
            do throws(WormholeError) {
                let reply = try await wormhole.requestData(
                    payload,
                    identifier: identifier,
                    timeout: .milliseconds(Int(timeout * 1000))
                )
                result.withLock { $0 = .success(reply) }
            } catch {
                result.withLock { $0 = .failure(error) }
            }
            done.signal()
        }
        done.wait()
        switch result.withLock({ $0 })! {
        case .success(let reply): Output.line(Output.jsonLine(reply))
        case .failure(let error): throw Output.fail("\(error)")
        }
    }
}

struct Respond: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Answer requests sent to IDENTIFIER by running a command for each one.",
        discussion: """
            The command runs with `sh -c`, the request's JSON on its standard input; what it prints is the reply. \
            When it exits with a non-zero status, the requester gets an error with the command's standard error. \
            "responding to IDENTIFIER" goes to standard error when ready.
            """
    )

    @OptionGroup var location: LocationOptions

    @Argument(help: "The identifier to answer.")
    var identifier: String

    @Option(name: .customLong("exec"), help: "The command that makes each reply.")
    var command: String

    @Option(help: "Exit after answering this many requests.")
    var count: Int?

    func run() throws {
        let wormhole = try location.makeWormhole()
        let answered = Locked(0)
        let done = DispatchSemaphore(value: 0)
        let command = command
        let limit = count
        let responder = try wormhole.respondToRequestData(withIdentifier: identifier) { request in
            defer {
                if answered.withLock({
                    $0 += 1
                    return $0
                }) == limit {
                    done.signal()
                }
            }
            return try Self.run(command, input: request)
        }
        FileHandle.standardError.write(Data("responding to \(identifier)\n".utf8))
        done.wait()
        // Let the last reply leave before the process ends.
        Thread.sleep(forTimeInterval: 0.1)
        responder.cancel()
    }

    struct CommandFailed: Error, CustomStringConvertible {
        var status: Int32
        var message: String
        var description: String { "the command exited with status \(status): \(message)" }
    }

    /// Runs `command` with `sh -c`, `input` on its standard input and `environment` added to this process's; returns
    /// what it printed, trimmed, or throws ``CommandFailed`` with its standard error when it exits with another
    /// status than 0.
    static func run(_ command: String, input: Data, environment: [String: String] = [:]) throws -> Data {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", command]
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, added in added }
        }
        let stdin = Pipe()
        let stdout = Pipe()
        let stderr = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        try process.run()
        // A command that does not read its input closes the pipe early: that is not an error of the request.
        try? stdin.fileHandleForWriting.write(contentsOf: input)
        try? stdin.fileHandleForWriting.close()
        let output = stdout.fileHandleForReading.readDataToEndOfFile()
        let errors = stderr.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw CommandFailed(
                status: process.terminationStatus,
                message: String(decoding: errors, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            )
        }
        return Data(String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).utf8)
    }
}

struct LiveSend: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "live-send",
        abstract: "Send a JSON message to the processes listening for IDENTIFIER right now; nothing is stored.",
        discussion: "Prints how many processes it reached; exits with status 1 when nobody is listening."
    )

    @OptionGroup var location: LocationOptions
    @Argument(help: "The identifier.") var identifier: String
    @Argument(help: "The message, as JSON. Read from standard input when left out.") var json: String?

    func run() throws {
        let payload = try validatedJSON(json, what: "message")
        do {
            Output.line("reached \(try location.makeWormhole().sendMessageData(payload, identifier: identifier))")
        } catch let error as WormholeError where error.code == .notReachable {
            throw Output.fail("\(error)")
        }
    }
}

struct LiveListen: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "live-listen",
        abstract: "Print each live message sent to IDENTIFIER while listening, one JSON line each."
    )

    @OptionGroup var location: LocationOptions
    @Argument(help: "The identifier.") var identifier: String
    @OptionGroup var limits: ListeningLimits

    func run() throws {
        let wormhole = try location.makeWormhole()
        try limits.listen(ready: "listening to \(identifier)") { tally in
            // Any JSON decodes as a JSONValue; what is not JSON is reported and listening goes on.
            try wormhole.listenForLiveMessages(
                withIdentifier: identifier,
                as: JSONValue.self,
                errorHandler: { Output.error("\($0)") }
            ) { message in
                Output.line(message.description)
                tally.add()
            }
        }
    }
}
