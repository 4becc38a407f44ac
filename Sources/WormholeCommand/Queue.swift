import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

struct Enqueue: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Append a JSON message to a durable queue.",
        discussion: "The message is the JSON argument, or standard input. Invalid JSON is refused and nothing appended."
    )

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
            """
    )

    @OptionGroup var location: LocationOptions

    @Argument(help: "The queue's identifier.")
    var identifier: String

    @Option(help: "The consumer's durable name.")
    var consumer: String

    @OptionGroup var limits: ListeningLimits

    func run() throws {
        let queue = try location.makeWormhole().queue(identifier)
        try limits.listen(ready: "consuming \(identifier)") { tally in
            // Any JSON decodes as a JSONValue: the tool needs no message type, and prints the payload as it is.
            try queue.consume(consumer: consumer, as: JSONValue.self, errorHandler: { Output.error("\($0)") }) {
                message in
                // Past the limit, refuse: those messages stay for the next consume.
                guard !tally.isReached else { throw CancellationError() }
                Output.line(Output.jsonLine(message.payload))
                tally.add()
            }
        }
    }
}

struct QueueStatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "queue-status",
        abstract: "Print a queue's size and each consumer's position and lag, as JSON."
    )

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
