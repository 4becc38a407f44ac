import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

struct Enqueue: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Append a JSON message to a durable queue.",
        discussion: """
            The message is the JSON argument, or standard input. Invalid JSON is refused and nothing appended. With \
            --delay or --at, consumers are offered it no earlier than then; with --expires-after, not after that \
            long past that time (a consumer that comes to it later makes it a dead letter, reason "expired").
            """
    )

    @OptionGroup var location: LocationOptions

    @Argument(help: "The queue's identifier.")
    var identifier: String

    @Argument(help: "The message, as JSON. Read from standard input when left out.")
    var json: String?

    @Option(help: "Offer it no earlier than this long from now (500ms, 30s, 5m, 1h).")
    var delay: DurationArgument?

    @Option(help: "Offer it no earlier than this time (ISO 8601, such as 2026-12-03T09:00:00Z).")
    var at: String?

    @Option(help: "Offer it no later than this long after it is due (now, or --delay or --at).")
    var expiresAfter: DurationArgument?

    func validate() throws {
        if delay != nil && at != nil { throw ValidationError("--delay and --at cannot be given together.") }
        if let at, Self.date(at) == nil {
            throw ValidationError("--at \(at) is not an ISO 8601 time, such as 2026-12-03T09:00:00Z.")
        }
    }

    static func date(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        if let date = formatter.date(from: text) { return date }
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.date(from: text)
    }

    func run() throws {
        let trimmed = try validatedJSON(json, what: "message")
        let queue = try location.makeWormhole().queue(identifier)
        guard delay != nil || at != nil || expiresAfter != nil else {
            try queue.enqueueData(trimmed)
            return
        }
        var schedule = QueueSchedule()
        if let delay { schedule = .after(delay.duration) }
        if let at, let date = Self.date(at) { schedule = .at(date) }
        if let expiresAfter { schedule = schedule.expiring(after: expiresAfter.duration) }
        try queue.enqueueData(trimmed, schedule: schedule)
    }
}

struct Consume: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print each message of a queue that a consumer has not handled, one JSON line each, then new ones.",
        discussion: """
            The consumer's position moves past a message once its line is printed: a later consume with the same \
            --consumer resumes after it. With --exec, each message is handled by running the command with `sh -c` \
            instead, the message's JSON on its standard input and WORMHOLE_OFFSET, WORMHOLE_ATTEMPT, \
            WORMHOLE_SENDER and WORMHOLE_SCHEDULED (1 for a message enqueued with --delay, --at or \
            --expires-after, whose offset is in the queue's scheduled log) in its environment; what it prints is printed. Exit status 0 acknowledges the message; \
            any other fails the attempt, and the message comes back after a back-off (--backoff, doubling each time) \
            until --max-attempts, then goes to the consumer's dead letters (see dead-letters). Later messages flow \
            past one that waits, unless --strict. "consuming IDENTIFIER" goes to standard error when ready. With \
            --count, exits after that many messages; with --timeout, exits with status 1 if they have not all come \
            by then (status 0 when no --count was given).
            """
    )

    @OptionGroup var location: LocationOptions

    @Argument(help: "The queue's identifier.")
    var identifier: String

    @Option(help: "The consumer's durable name.")
    var consumer: String

    @Option(name: .customLong("exec"), help: "A command that handles each message (exit status 0 acknowledges it).")
    var command: String?

    @Option(help: "How many times a message is offered before it goes to the dead letters.")
    var maxAttempts: Int = QueueRetryPolicy.default.maximumAttempts

    @Option(help: "The wait after a first failed attempt (500ms, 30s, 5m, 1h; doubling each time, at most 5m).")
    var backoff: DurationArgument = DurationArgument(QueueRetryPolicy.default.firstDelay)

    @Flag(help: "Later messages wait for one that failed, instead of flowing past it.")
    var strict = false

    @OptionGroup var limits: ListeningLimits

    func validate() throws {
        if maxAttempts < 1 { throw ValidationError("--max-attempts must be at least 1.") }
    }

    func run() throws {
        let queue = try location.makeWormhole().queue(identifier)
        let policy = QueueRetryPolicy(
            maximumAttempts: maxAttempts,
            firstDelay: backoff.duration,
            order: strict ? .strict : .unordered
        )
        let command = command
        try limits.listen(ready: "consuming \(identifier)") { tally in
            // Any JSON decodes as a JSONValue: the tool needs no message type, and prints the payload as it is.
            try queue.consume(
                consumer: consumer,
                as: JSONValue.self,
                retry: policy,
                errorHandler: { Output.error("\($0)") }
            ) { message in
                // Past the limit, stop: those messages stay for the next consume.
                guard !tally.isReached else { throw CancellationError() }
                if let command {
                    let output = try Respond.run(
                        command,
                        input: message.payload,
                        environment: [
                            "WORMHOLE_OFFSET": String(message.offset),
                            "WORMHOLE_ATTEMPT": String(message.attempt),
                            "WORMHOLE_SENDER": message.sender,
                            "WORMHOLE_SCHEDULED": message.isScheduled ? "1" : "0",
                        ]
                    )
                    if !output.isEmpty { Output.line(String(decoding: output, as: UTF8.self)) }
                } else {
                    Output.line(Output.jsonLine(message.payload))
                }
                tally.add()
            }
        }
    }
}

struct DeadLetters: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dead-letters",
        abstract: "List the messages a queue's consumer gave up on, one JSON line each; or requeue or drop them.",
        discussion: """
            Each line holds the message ("message", its JSON, or "payloadBase64" when it is not JSON), its offset \
            (in the queue, or in its scheduled log when "scheduled" is true), sender and time, how many attempts it \
            had, why it was given up on ("failed", "undecodable" or "expired") and the last error. --retry offers them to the consumer again from attempt 1; --drop removes them. Both take \
            every dead letter, or those given with --offset, and print how many they moved.
            """
    )

    @OptionGroup var location: LocationOptions

    @Argument(help: "The queue's identifier.")
    var identifier: String

    @Option(help: "The consumer's durable name.")
    var consumer: String

    @Flag(help: "Offer the dead letters to the consumer again.")
    var retry = false

    @Flag(help: "Remove the dead letters for good.")
    var drop = false

    @Option(name: .customLong("offset"), help: "Only the dead letter of this offset (repeatable).")
    var offsets: [UInt64] = []

    func validate() throws {
        if retry && drop { throw ValidationError("--retry and --drop cannot be given together.") }
        if !offsets.isEmpty && !retry && !drop { throw ValidationError("--offset goes with --retry or --drop.") }
    }

    func run() throws {
        let letters = try location.makeWormhole().queue(identifier).deadLetters(consumer: consumer)
        let chosen = offsets.isEmpty ? nil : offsets
        if retry {
            Output.line("requeued \(try letters.requeue(offsets: chosen))")
        } else if drop {
            Output.line("dropped \(try letters.drop(offsets: chosen))")
        } else {
            for letter in try letters.list() { Output.line(Self.line(letter)) }
            for key in try letters.unreadableKeys {
                Output.error("dead letter \(key) is not one this version reads; --drop removes it")
            }
        }
    }

    static func line(_ letter: QueueDeadLetter) -> String {
        var object: [String: JSONValue] = [
            "offset": .integer(Int64(clamping: letter.offset)),
            "sender": .string(letter.sender),
            "enqueuedAt": .string(Output.time(letter.date)),
            "deadLetteredAt": .string(Output.time(letter.deadLetteredDate)),
            "attempts": .integer(Int64(letter.attempts)),
            "reason": .string(letter.reason.rawValue),
            "lastError": .string(letter.lastError),
            "scheduled": .bool(letter.isScheduled),
        ]
        if let message = try? JSONDecoder().decode(JSONValue.self, from: letter.payload) {
            object["message"] = message
        } else {
            object["payloadBase64"] = .string(letter.payload.base64EncodedString())
        }
        return Output.objectLine(object)
    }
}

/// A duration on the command line: `500ms`, `30s`, `5m`, `1h`, or a number of seconds.
struct DurationArgument: ExpressibleByArgument, Sendable {
    var duration: Duration

    init(_ duration: Duration) { self.duration = duration }

    init?(argument: String) {
        let units: [(suffix: String, seconds: Double)] = [("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)]
        var text = argument
        var scale = 1.0
        for unit in units where argument.hasSuffix(unit.suffix) {
            text = String(argument.dropLast(unit.suffix.count))
            scale = unit.seconds
            break
        }
        guard let value = Double(text), value.isFinite, value >= 0 else { return nil }
        duration = .nanoseconds(Int64(min(value * scale, 1e9) * 1e9))
    }

    var defaultValueDescription: String { "\(duration)" }
}

struct QueueStatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "queue-status",
        abstract: "Print a queue's size and each consumer's position and lag, as JSON.",
        discussion: """
            For each consumer: offset, lagBytes and lagMessages; waitingForRetry and nextRetryNanoseconds (the \
            messages set aside for another attempt, and when the first comes due); scheduled (messages enqueued \
            with --delay, --at or --expires-after that wait for their time); deadLetters.
            """
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
