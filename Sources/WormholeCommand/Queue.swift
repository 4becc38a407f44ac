import ArgumentParser
import Foundation
import WormholeCLI
import Synchronization
import WormholeKit

struct Enqueue: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Append a JSON message to a durable queue.",
        discussion: "The message is the JSON argument, or standard input. Invalid JSON is refused and nothing appended.")

    @OptionGroup var location: LocationOptions

    @Argument(help: "The queue's identifier.")
    var identifier: String

    @Argument(help: "The message, as JSON. Read from standard input when left out.")
    var json: String?

    func run() throws {
        let trimmed = try validatedJSON(json, what: "message")
        try location.makeWormhole().queue(identifier).enqueueData(trimmed)
    }
}

struct Consume: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print each message of a queue that a consumer has not handled, one JSON line each, then new ones.",
        discussion: """
            The consumer's position moves past a message once its line is printed: a later consume with the same \
            --consumer resumes after it. "consuming IDENTIFIER" goes to standard error when ready. With --count, \
            exits after that many messages; with --timeout, exits with status 1 if they have not all come by then \
            (status 0 when no --count was given).
            """)

    @OptionGroup var location: LocationOptions

    @Argument(help: "The queue's identifier.")
    var identifier: String

    @Option(help: "The consumer's durable name.")
    var consumer: String

    @Option(help: "Exit after this many messages.")
    var count: Int?

    @Option(help: "Exit after this many seconds.")
    var timeout: Double?

    func validate() throws {
        if let count, count < 1 { throw ValidationError("--count must be at least 1.") }
    }

    func run() throws {
        let queue = try location.makeWormhole().queue(identifier)
        let printed = Locked(0)
        let done = DispatchSemaphore(value: 0)
        let limit = count
        // Any JSON decodes as a JSONValue: the tool needs no message type, and prints the payload as it is.
        let consumer = try queue.consume(
            consumer: self.consumer, as: JSONValue.self, errorHandler: { Output.error("\($0)") }
        ) { message in
            // Past the limit, refuse: those messages stay for the next consume.
            guard printed.withLock({ $0 < (limit ?? .max) }) else { throw CancellationError() }
            Output.line(Output.jsonLine(message.payload))
            if printed.withLock({ $0 += 1; return $0 }) == limit { done.signal() }
        }
        FileHandle.standardError.write(Data("consuming \(identifier)\n".utf8))
        let finished = Output.wait(for: done, timeout: timeout)
        consumer.cancel()
        if !finished, let limit {
            throw Output.fail("timed out with \(printed.withLock { $0 }) of \(limit) messages")
        }
    }
}

struct QueueStatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "queue-status", abstract: "Print a queue's size and each consumer's position and lag, as JSON.")

    @OptionGroup var location: LocationOptions

    @Argument(help: "The queue's identifier.")
    var identifier: String

    func run() throws {
        let status = try location.makeWormhole().queue(identifier).status()
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        Output.line(String(decoding: try encoder.encode(status), as: UTF8.self))
    }
}
