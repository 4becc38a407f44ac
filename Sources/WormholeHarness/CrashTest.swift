import ArgumentParser
import Foundation
import GRDB
import WormholeCLI
import WormholeKit
import WormholeStore

/// `wormhole crash-test`: kills writers and consumers with SIGKILL at random points, many times, and checks after
/// each kill that nothing was torn, lost or delivered twice. `scripts/crash-test` runs it with 1,000 kills per mode;
/// the test suite runs it with fewer. Hidden from help.
///
/// Each victim is a copy of this tool (`crash-victim`) that prints "started" and then writes (or consumes) in a loop
/// until it is killed, a random 0–10 ms after it started: every kill lands in the middle of the work.
struct CrashTest: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crash-test",
        abstract: "Kill writers and consumers at random and check what they leave.",
        shouldDisplay: false
    )

    enum Mode: String, ExpressibleByArgument, CaseIterable, Sendable {
        case mailbox, queue, suite, store
        case queueRetry = "queue-retry"
    }

    @Argument var mode: Mode
    @Option(help: "How many victims to kill.") var kills = 1000
    @Option(help: "The directory to work in; it is created, and left for inspection on failure.") var directory: String

    func run() throws {
        try FileManager.default.createDirectory(
            atPath: directory,
            withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700]
        )
        let start = Date()
        var report = CrashReport(mode: mode, kills: 0)
        switch mode {
        case .mailbox: try runMailbox(&report)
        case .queue: try runQueue(&report)
        case .queueRetry: try runQueueRetry(&report)
        case .suite: try runSuite(&report)
        case .store: try runStore(&report)
        }
        report.seconds = Date().timeIntervalSince(start)
        Output.line(report.summary)
        if !report.failures.isEmpty {
            for failure in report.failures.prefix(20) { Output.error(failure) }
            throw ExitCode(1)
        }
    }

    /// Starts a victim, waits until it works, lets it work 0–10 ms, kills it; returns what it printed.
    private func killVictim(_ arguments: [String]) throws -> [String] {
        let lines = Locked<[String]>([])
        let victim = try ChildProcess(
            arguments: ["crash-victim"] + arguments + ["--directory", directory],
            readyLine: "started"
        ) { line in lines.withLock { $0.append(line) } }
        guard victim.waitUntilReady(timeout: 30) else {
            victim.kill()
            throw Output.fail("a victim did not start: \(arguments.joined(separator: " "))")
        }
        usleep(UInt32.random(in: 0...10_000))
        victim.kill()
        return lines.withLock { $0 }
    }

    // MARK: Mailbox: a reader never sees a torn or half-written message

    private func runMailbox(_ report: inout CrashReport) throws {
        let wormhole = try Wormhole(directory: directory)
        let errors = Locked<[String]>([])
        let delivered = Locked(0)
        let listener = try wormhole.listenForMessage(
            withIdentifier: "m",
            as: CrashMessage.self,
            on: .notifierThread,
            errorHandler: { error in errors.withLock { $0.append("listener: \(error)") } }
        ) { message in
            if !message.isIntact { errors.withLock { $0.append("listener got a damaged message: \(message)") } }
            delivered.withLock { $0 += 1 }
        }
        var lastIndex: [String: Int] = [:]
        for kill in 0..<kills {
            let tag = "k\(kill)"
            _ = try killVictim(["mailbox", "--tag", tag])
            report.kills += 1
            // Read what the kill left: a whole message, never a torn one.
            do {
                guard let message = try wormhole.message(withIdentifier: "m", as: CrashMessage.self) else { continue }
                report.checks += 1
                if !message.isIntact { report.failures.append("kill \(kill): damaged message \(message)") }
                if message.index < lastIndex[message.writer, default: -1] {
                    report.failures.append("kill \(kill): \(message.writer) went back to \(message.index)")
                }
                lastIndex[message.writer] = message.index
            } catch {
                report.failures.append("kill \(kill): the mailbox could not be read: \(error)")
            }
        }
        listener.cancel()
        report.failures += errors.withLock { $0 }
        report.details = "\(report.checks) reads after a kill, \(delivered.withLock { $0 }) deliveries to a listener"
    }

    // MARK: Queue: producers and consumers killed; nothing acknowledged lost or repeated, nothing torn delivered

    private func runQueue(_ report: inout CrashReport) throws {
        let queue = try Wormhole(directory: directory).queue("jobs")
        let errors = Locked<[String]>([])
        let all = Locked<[QueueExerciseMessage]>([])
        // A consumer in this process sees everything appended: each producer's messages must be a prefix, in order.
        let observer = try queue.consume(
            consumer: "all",
            as: QueueExerciseMessage.self,
            on: .notifierThread,
            errorHandler: { error in errors.withLock { $0.append("consumer all: \(error)") } }
        ) { message in all.withLock { $0.append(message.value) } }
        var handled: [String] = []
        var consumerKills = 0
        for kill in 0..<kills {
            if kill % 2 == 0 {
                // Half the producers append one message per write, half in batches.
                _ = try killVictim(["queue-produce", "--tag", "k\(kill)", "--batch", kill % 4 == 0 ? "1" : "37"])
            } else {
                handled += try killVictim(["queue-consume", "--tag", "worker"]).filter { $0.hasPrefix("handled ") }
                consumerKills += 1
            }
            report.kills += 1
        }
        // Drain what the killed consumer left, then compare.
        let endOffset = try queue.status().endOffset
        let rest = Locked<[String]>([])
        let drain = try queue.consume(consumer: "worker", as: QueueExerciseMessage.self, on: .notifierThread) {
            message in
            rest.withLock { $0.append("handled \(message.value.writer) \(message.value.index)") }
        }
        let deadline = Date().addingTimeInterval(120)
        while drain.position < endOffset || observer.position < endOffset, Date() < deadline { usleep(10_000) }
        drain.cancel()
        observer.cancel()
        report.failures += errors.withLock { $0 }
        let appended = all.withLock { $0 }
        var byWriter: [String: [Int]] = [:]
        for message in appended { byWriter[message.writer, default: []].append(message.index) }
        for (writer, indices) in byWriter where indices != Array(0..<indices.count) {
            report.failures.append("producer \(writer): not a prefix in order (\(indices.count) messages)")
        }
        let expected = Set(appended.map { "handled \($0.writer) \($0.index)" })
        let seen = handled + rest.withLock { $0 }
        let lost = expected.subtracting(seen)
        let repeated = seen.count - Set(seen).count
        if !lost.isEmpty {
            report.failures.append("\(lost.count) messages never handled by the killed consumer, e.g. \(lost.first!)")
        }
        // A killed consumer can repeat only the one message it was handling and had not acknowledged.
        if repeated > consumerKills {
            report.failures.append("\(repeated) repeats for \(consumerKills) consumer kills")
        }
        report.checks = appended.count
        report.details =
            "\(kills - consumerKills) producers and \(consumerKills) consumers killed; \(appended.count) messages "
            + "appended whole, 0 torn delivered, \(lost.count) lost, \(repeated) handled twice (at most 1 a consumer kill)"
    }

    // MARK: Queue retries: consumers whose handlers fail, killed; every message handled or a dead letter, once

    /// The policy of the retry victims and of the drain: 3 attempts, 1 ms apart, so that kills land among the writes
    /// of attempts, set-aside messages and dead letters.
    static let retryPolicy = QueueRetryPolicy(maximumAttempts: 3, firstDelay: .milliseconds(1), jitter: 0)

    /// Whether a retry victim's handler fails `index` at `attempt`: every fifth message always (it must end a dead
    /// letter), every fifth but one at its first attempt only (it must end handled).
    static func retryFails(index: Int, attempt: Int) -> Bool {
        index % 5 == 2 || (index % 5 == 4 && attempt == 1)
    }

    private func runQueueRetry(_ report: inout CrashReport) throws {
        let queue = try Wormhole(directory: directory).queue("jobs")
        let total = max(500, kills * 4)
        try queue.enqueue(contentsOf: (0..<total).map { QueueExerciseMessage(writer: "p", index: $0) })
        var handled: [String] = []
        for _ in 0..<kills {
            handled += try killVictim(["queue-retry-consume", "--tag", "worker"]).filter { $0.hasPrefix("handled ") }
            report.kills += 1
        }
        // The drain: the same consumer, in this process, until its position is at the end and nothing waits.
        let rest = Locked<[String]>([])
        let errors = Locked<[String]>([])
        let drain = try queue.consume(
            consumer: "worker",
            as: QueueExerciseMessage.self,
            retry: Self.retryPolicy,
            on: .notifierThread,
            errorHandler: { error in
                if error.code != .handlerFailed { errors.withLock { $0.append("drain: \(error)") } }
            }
        ) { message in
            if Self.retryFails(index: message.value.index, attempt: message.attempt) { throw RetryVictimFailure() }
            rest.withLock { $0.append("handled \(message.value.index)") }
        }
        let end = try queue.status().endOffset
        let deadline = Date().addingTimeInterval(120)
        while Date() < deadline {
            let consumer = try queue.status().consumers.first { $0.name == "worker" }
            if drain.position >= end, consumer?.waitingForRetry == 0 { break }
            usleep(10_000)
        }
        drain.cancel()
        report.failures += errors.withLock { $0 }
        let seen = handled + rest.withLock { $0 }
        let good = Set((0..<total).filter { $0 % 5 != 2 }.map { "handled \($0)" })
        let lost = good.subtracting(seen)
        let wrongly = Set(seen).subtracting(good)
        let repeated = seen.count - Set(seen).count
        let dead = try queue.deadLetters(consumer: "worker").list().map {
            try JSONDecoder().decode(QueueExerciseMessage.self, from: $0.payload).index
        }
        let poison = Set((0..<total).filter { $0 % 5 == 2 })
        if !lost.isEmpty { report.failures.append("\(lost.count) good messages never handled, e.g. \(lost.first!)") }
        if !wrongly.isEmpty { report.failures.append("\(wrongly.count) messages handled that always fail") }
        if Set(dead) != poison || dead.count != poison.count {
            report.failures.append(
                "dead letters: \(dead.count) (\(Set(dead).count) distinct), expected the \(poison.count) failing ones"
            )
        }
        // A kill repeats at most the message its handler was running.
        if repeated > kills { report.failures.append("\(repeated) repeats for \(kills) kills") }
        report.checks = total
        report.details =
            "\(kills) failing consumers killed over \(total) messages: \(good.count) handled, \(dead.count) dead "
            + "letters, \(lost.count) lost, \(repeated) handled twice (at most 1 a kill)"
    }

    // MARK: Suite: a committed update is never lost, an update is never half applied

    private func runSuite(_ report: inout CrashReport) throws {
        let suite = try Wormhole(directory: directory).suite("settings")
        var committed: [String: Int] = [:]
        var lastCounter = 0
        for kill in 0..<kills {
            let tag = "k\(kill % 8)"
            let lines = try killVictim(["suite", "--tag", tag])
            report.kills += 1
            if let last = lines.last(where: { $0.hasPrefix("committed ") }), let count = Int(last.dropFirst(10)) {
                committed[tag] = max(committed[tag, default: 0], count)
            }
            do {
                let values = try suite.snapshot()
                report.checks += 1
                let counter = values["counter", as: Int.self] ?? 0
                let sum = (0..<8).compactMap { values["writer-k\($0)", as: Int.self] }.reduce(0, +)
                if counter != sum {
                    report.failures.append("kill \(kill): counter \(counter) but the writers sum to \(sum)")
                }
                if counter < lastCounter { report.failures.append("kill \(kill): counter went back to \(counter)") }
                lastCounter = counter
                if let mine = values["writer-\(tag)", as: Int.self], mine < committed[tag, default: 0] {
                    report.failures.append(
                        "kill \(kill): \(tag) committed \(committed[tag]!) but the suite has \(mine)"
                    )
                }
            } catch {
                report.failures.append("kill \(kill): the suite could not be read: \(error)")
            }
        }
        report.details =
            "\(report.checks) reads after a kill; \(lastCounter) committed updates, none lost or half applied"
    }

    // MARK: Store: committed transactions kept with their history; a durable consumer sees each once

    private func runStore(_ report: inout CrashReport) throws {
        let path = directory + "/store.sqlite"
        let store = try SharedStore(
            path: path,
            migrator: StoreFixtures.itemsMigrator,
            configuration: .init(author: "checker")
        )
        // What the durable consumer receives: each transaction's id, author and rows inserted. (History is purged
        // once every consumer has merged it, so the consumer, not the history table, is what is checked.)
        let received = Locked<[(id: Int64, author: String, inserted: Int)]>([])
        let errors = Locked<[String]>([])
        let observe = { () throws -> RemoteChangeObserver in
            try store.observeRemoteChanges(
                consumer: "checker",
                errorHandler: { error in errors.withLock { $0.append("observer: \(error)") } }
            ) { transaction in
                let inserted = transaction.tables["item"]?.inserted.count ?? 0
                received.withLock { $0.append((transaction.id, transaction.author, inserted)) }
            }
        }
        var observer = try observe()
        for kill in 0..<kills {
            let tag = "k\(kill)"
            let lines = try killVictim(["store", "--tag", tag])
            report.kills += 1
            let committed = lines.last(where: { $0.hasPrefix("committed ") }).flatMap { Int($0.dropFirst(10)) }
            do {
                let (check, values) = try store.read { db in
                    (
                        try String.fetchOne(db, sql: "PRAGMA quick_check") ?? "",
                        try Int.fetchAll(
                            db,
                            sql: "SELECT value FROM item WHERE writer = ? ORDER BY value",
                            arguments: [tag]
                        )
                    )
                }
                report.checks += 1
                if check != "ok" { report.failures.append("kill \(kill): quick_check says \(check)") }
                if values != Array(0..<values.count) {
                    report.failures.append("kill \(kill): rows of \(tag) have gaps")
                }
                if let committed, values.count < committed + 1 {
                    report.failures.append(
                        "kill \(kill): \(tag) committed \(committed + 1) but \(values.count) rows are kept"
                    )
                }
            } catch {
                report.failures.append("kill \(kill): the store could not be read: \(error)")
            }
        }
        let rows = try store.read { db in
            try Row.fetchAll(db, sql: "SELECT writer, count(*) AS n FROM item GROUP BY writer")
        }
        var kept: [String: Int] = [:]
        for row in rows { kept[row["writer"]] = row["n"] }
        let total = kept.values.reduce(0, +)
        // The last victim may have died between its commit and its notification: then nothing wakes the observer
        // until the next commit. A durable consumer that starts again catches up from its token, which is what this
        // checks: each transaction still comes once.
        observer.cancel()
        observer = try observe()
        let deadline = Date().addingTimeInterval(120)
        while received.withLock({ $0.count }) < total, Date() < deadline { usleep(10_000) }
        observer.cancel()
        let transactions = received.withLock { $0 }
        report.failures += errors.withLock { $0 }
        if transactions.count != total {
            report.failures.append("the durable consumer received \(transactions.count) of \(total) transactions")
        }
        if Set(transactions.map(\.id)).count != transactions.count {
            report.failures.append("the durable consumer received a transaction twice")
        }
        var insertedBy: [String: Int] = [:]
        for transaction in transactions { insertedBy[transaction.author, default: 0] += transaction.inserted }
        if insertedBy != kept { report.failures.append("the rows received per author differ from the rows kept") }
        report.details =
            "\(total) committed transactions kept with their history, each received once by a durable consumer "
            + "(started again after the kills)"
    }
}

/// What a crash test found.
struct CrashReport {
    var mode: CrashTest.Mode
    var kills: Int
    var checks = 0
    var failures: [String] = []
    var details = ""
    var seconds: Double = 0

    var summary: String {
        String(
            format: "crash-test %@: %d SIGKILLs, %d failures, %.0f s: %@",
            mode.rawValue,
            kills,
            failures.count,
            seconds,
            details
        )
    }
}

/// A mailbox message whose body can be checked: `check` is derived from `index`.
struct CrashMessage: Codable, Sendable {
    var writer: String
    var index: Int
    var check: String

    init(writer: String, index: Int) {
        self.writer = writer
        self.index = index
        check = Self.check(for: index)
    }

    static func check(for index: Int) -> String { String(repeating: String(index % 10), count: 100 + index % 400) }

    var isIntact: Bool { check == Self.check(for: index) }
}

/// The victim of `crash-test`: prints "started", then works until it is killed. Hidden from help.
struct CrashVictim: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crash-victim",
        abstract: "Work until killed, for crash-test.",
        shouldDisplay: false
    )

    enum Role: String, ExpressibleByArgument {
        case mailbox
        case queueProduce = "queue-produce"
        case queueConsume = "queue-consume"
        case queueRetryConsume = "queue-retry-consume"
        case suite, store
    }

    @Argument var role: Role
    @Option var directory: String
    @Option var tag = "w"
    @Option var batch = 1

    func run() throws {
        switch role {
        case .mailbox:
            let wormhole = try Wormhole(directory: directory)
            Output.line("started")
            for index in 0... {
                try wormhole.passMessageObject(CrashMessage(writer: tag, index: index), identifier: "m")
            }
        case .queueProduce:
            let queue = try Wormhole(directory: directory).queue("jobs")
            Output.line("started")
            for start in stride(from: 0, to: Int.max, by: batch) {
                if batch == 1 {
                    try queue.enqueue(QueueExerciseMessage(writer: tag, index: start))
                } else {
                    try queue.enqueue(
                        contentsOf: (start..<start + batch).map { QueueExerciseMessage(writer: tag, index: $0) }
                    )
                }
            }
        case .queueConsume:
            let queue = try Wormhole(directory: directory).queue("jobs")
            // "started" comes with the first message, so that the kill lands while the backlog is being handled
            // (consume(...) delivers it before returning). "handled" is printed before the handler returns, so before
            // the message is acknowledged.
            let started = Locked(false)
            let announce: @Sendable () -> Void = {
                let first = started.withLock { started in
                    defer { started = true }
                    return !started
                }
                if first { Output.line("started") }
            }
            let consumer = try queue.consume(consumer: tag, as: QueueExerciseMessage.self, on: .notifierThread) {
                message in
                announce()
                Output.line("handled \(message.value.writer) \(message.value.index)")
            }
            announce()
            waitWhileParentLives(keeping: consumer)
        case .queueRetryConsume:
            let queue = try Wormhole(directory: directory).queue("jobs")
            Output.line("started")
            let consumer = try queue.consume(
                consumer: tag,
                as: QueueExerciseMessage.self,
                retry: CrashTest.retryPolicy,
                on: .notifierThread,
                errorHandler: { _ in }
            ) { message in
                if CrashTest.retryFails(index: message.value.index, attempt: message.attempt) {
                    throw RetryVictimFailure()
                }
                Output.line("handled \(message.value.index)")
            }
            waitWhileParentLives(keeping: consumer)
        case .suite:
            let suite = try Wormhole(directory: directory).suite("settings")
            Output.line("started")
            while true {
                var mine = 0
                try suite.update(direction: tag) { (values: inout SuiteValues) throws(WormholeError) in
                    mine = (values["writer-\(tag)", as: Int.self] ?? 0) + 1
                    try values.set((values["counter", as: Int.self] ?? 0) + 1, forKey: "counter")
                    try values.set(mine, forKey: "writer-\(tag)")
                }
                Output.line("committed \(mine)")
            }
        case .store:
            let store = try SharedStore(
                path: directory + "/store.sqlite",
                migrator: StoreFixtures.itemsMigrator,
                configuration: .init(author: tag, observesRemoteChanges: false)
            )
            Output.line("started")
            for index in 0... {
                try store.write { db in
                    try db.execute(sql: "INSERT INTO item(writer, value) VALUES (?, ?)", arguments: [tag, index])
                }
                Output.line("committed \(index)")
            }
        }
    }
}

/// What a retry victim's handler throws for the messages that fail.
struct RetryVictimFailure: Error, CustomStringConvertible {
    var description: String { "this message fails by design" }
}
