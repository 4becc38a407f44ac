import ArgumentParser
import Foundation
import Logging
import Synchronization
import WormholeCLI
import WormholeCrashStates
import WormholeKit

#if canImport(Glibc)
import Glibc
#endif

/// `power-loss MODE`: runs a workload under `strace`, builds every state a power cut may leave at each point (see
/// ``CrashStates``), opens each with the library and checks the promises of the mode. `scripts/power-loss` runs it
/// on a workload per mode; the tests run small ones. Hidden from help.
struct PowerLoss: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "power-loss",
        abstract: "Explore the states a power cut leaves of a workload, and check each.",
        shouldDisplay: false
    )

    enum Mode: String, ExpressibleByArgument, CaseIterable, Sendable { case mailbox, queue, suite, transfer }

    @Argument var mode: Mode
    @Flag(help: "Run the workload with synchronizesWrites, and check its stronger promise.") var synchronizes = false
    @Option(help: "How many operations the workload makes.") var count = 40
    @Option(help: "At most this many states at each crash point.") var statesPerPoint = 200
    @Option(help: "The seed of the random combinations.") var seed: UInt64 = 1
    @Option(help: "The directory to work in (created; removed unless something failed).") var directory: String?
    @Flag(help: "Print the operations read from the trace, numbered as the reports number them.") var operations = false

    func run() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/strace") else {
            throw Output.fail("power-loss records the workload with strace: install it (apt-get install strace)")
        }
        // Absolute: strace prints absolute paths, and a relative root would leave every operation outside it.
        let work = URL(
            fileURLWithPath: directory ?? NSTemporaryDirectory() + "wormhole-power-loss-\(UUID().uuidString.prefix(8))"
        ).standardizedFileURL.path
        try? FileManager.default.removeItem(atPath: work)
        let root = work + "/root"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        let started = Date()
        let trace = work + "/trace"
        var arguments = [
            "-f", "-qq", "-y", "-xx", "-s", "67108864", "-o", trace,
            "-e", "trace=" + SystemCallTrace.tracedCalls.joined(separator: ","),
            try executablePath(), "power-workload", mode.rawValue, "--directory", root + "/wormhole",
            "--count", String(count),
        ]
        if synchronizes { arguments.append("--synchronizes") }
        let status = try runProcess("/usr/bin/strace", arguments)
        guard status == 0 else { throw Output.fail("the workload failed (status \(status)); its trace is in \(trace)") }
        let operations = try FileOperations(
            calls: try SystemCallTrace.parse(
                String(decoding: try Data(contentsOf: URL(fileURLWithPath: trace)), as: UTF8.self)
            ),
            root: root
        )
        guard operations.operations.contains(where: { if case .marker = $0 { false } else { true } }) else {
            throw Output.fail(
                "the trace holds no operation under \(root): nothing to explore (its trace is in \(trace))"
            )
        }
        if self.operations {
            for (index, operation) in operations.operations.enumerated() {
                Output.line("#\(index) \(operation.summary)")
            }
        }
        let states = CrashStates(operations)
        var generator = SplitMix64(seed: seed)
        var checked = 0
        let recoveries = Counter()
        // Every problem is counted; the first 1,000 are kept to print.
        var failureCount = 0
        var failures: [String] = []
        let firstFailure = work + "/first-failure"
        // Each state takes the workload's own path, so that paths the files hold (a delivery's destination) stay true.
        try FileManager.default.moveItem(atPath: root, toPath: work + "/workload")
        let stateDirectory = root
        let points = states.crashPoints
        for point in points {
            let markers = states.markers(before: point)
            for state in states.states(at: point, budget: statesPerPoint, using: &generator) {
                try? FileManager.default.removeItem(atPath: stateDirectory)
                try FileManager.default.createDirectory(atPath: stateDirectory, withIntermediateDirectories: false)
                try state.tree.materialize(into: stateDirectory)
                let problems = PowerLossCheck(
                    mode: mode,
                    synchronizes: synchronizes,
                    directory: root + "/wormhole",
                    acknowledged: markers,
                    recoveries: recoveries,
                    upcoming: states.markers(before: operations.operations.count).dropFirst(markers.count).first,
                    count: count
                ).run()
                checked += 1
                if failureCount == 0, !problems.isEmpty {
                    // The first failing state as the power cut left it: the checks may have changed the one checked.
                    try FileManager.default.createDirectory(atPath: firstFailure, withIntermediateDirectories: false)
                    try state.tree.materialize(into: firstFailure)
                }
                failureCount += problems.count
                for problem in problems where failures.count < 1000 {
                    failures.append(
                        "crash point \(point) of \(operations.operations.count) (\(markers.last ?? "before any call returned")); "
                            + "\(state.summary): \(problem)\n    files: \(state.tree.listing.joined(separator: ", "))"
                    )
                }
            }
        }
        let summary = String(
            format: "power-loss %@ %@: %d operations, %d crash points, %d states checked, %d failures, %.0f s; "
                + "%d states gave a documented error and recovered as it says",
            mode.rawValue,
            synchronizes ? "synchronizesWrites" : "default",
            operations.operations.count,
            points.count,
            checked,
            failureCount,
            Date().timeIntervalSince(started),
            recoveries.value
        )
        Output.line(summary)
        if failureCount > 0 {
            for failure in failures.prefix(10) { Output.error(failure) }
            Output.error(
                "kept in \(work): the trace, the first failing state as the power cut left it (first-failure), and "
                    + "the last state checked, as its checks left it (root)"
            )
            throw ExitCode(1)
        }
        try? FileManager.default.removeItem(atPath: work)
    }

    /// The path of this program's executable, for strace to run it again (found before strace replaces it).
    private func executablePath() throws -> String {
        #if os(Linux) || os(Android)
        return try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        #else
        // strace exists on Linux only: the explorer's trace cannot be made here.
        throw Output.fail("the power-loss explorer traces its workloads with strace, which exists on Linux only")
        #endif
    }

    private func runProcess(_ executable: String, _ arguments: [String]) throws -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        try process.run()
        process.waitUntilExit()
        return process.terminationStatus
    }
}

/// A workload for `power-loss`, run under `strace`: it makes its calls in order from one thread and, after each
/// returns, says so with `write(-1, "…")`, a call that fails and that the trace shows in place. Hidden from help.
struct PowerWorkload: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "power-workload",
        abstract: "The traced workload of power-loss.",
        shouldDisplay: false
    )

    @Argument var mode: PowerLoss.Mode
    @Option var directory: String
    @Option var count = 40
    @Flag var synchronizes = false

    func run() throws {
        // Traced by system calls: positions go through the descriptor, where the trace sees them.
        QueueCursorFile.storesThroughMapping.store(false, ordering: .relaxed)
        let wormhole = try Wormhole(directory: directory, configuration: PowerLossCheck.configuration(synchronizes))
        switch mode {
        case .mailbox:
            // Three mailboxes; every fifth message is too big for the slots the first ones made, so the file is
            // rewritten whole then. The file of "c" is first made empty, as a listener makes it, so that its first
            // message replaces a file that holds none.
            guard let files = wormhole.transiting as? FileTransiting else {
                throw ValidationError("the power-loss workload needs a wormhole on a directory")
            }
            if let errno = files.createEmptyMailbox(identifier: "c") {
                throw ValidationError("could not make the empty mailbox c: \(errno)")
            }
            mark("empty c")
            for index in 0..<count {
                let identifier = PowerLossMessage.mailbox(for: index)
                try wormhole.passMessageObject(PowerLossMessage(index: index), identifier: identifier)
                mark("mailbox \(identifier) \(index)")
            }
        case .queue:
            let queue = try wormhole.queue("jobs")
            let cursor = try queue.log.openCursor(consumer: "c")
            mark("registered c")
            var index = 0
            var round = 0
            while index < count {
                // One message, then a batch of three, alternately; all of one size, so that records appended after
                // a power cut can start exactly where a lost one did.
                let batch = round % 2 == 0 ? 1 : 3
                let payloads = (index..<min(count, index + batch)).map(PowerLossMessage.queuePayload(index:))
                if payloads.count == 1 {
                    try queue.enqueueData(payloads[0])
                } else {
                    try queue.enqueueData(contentsOf: payloads)
                }
                index += payloads.count
                mark("enqueued \(index)")
                // The consumer handles three messages every other round, and reclaims the space they took.
                if round % 2 == 1 {
                    let records = try cursor.read(maximumCount: 3)
                    if let last = records.last, let handled = PowerLossMessage.queueIndex(last.payload) {
                        try cursor.acknowledge(through: last.end)
                        mark("acknowledged c \(handled)")
                        try queue.reclaimSpace()
                        mark("reclaimed")
                    }
                }
                round += 1
            }
        case .suite:
            let suite = try wormhole.suite("settings")
            for index in 1...count {
                // Two keys in one update, so that half an update shows; every eighth update adds a long value, so that
                // the log outgrows its snapshot and is compacted (a version 1 file outgrew its slots).
                try suite.update { values in
                    try values.set(index, forKey: "counter")
                    try values.set(index, forKey: "k\(index % 4)")
                    if index % 8 == 0 { try values.set(PowerLossMessage.longSuiteValue(index), forKey: "long\(index)") }
                }
                mark("suite \(index)")
            }
        case .transfer:
            let transfers = try wormhole.transfers("files")
            // The files to send live outside the traced directory, as a user's files do.
            let sources =
                URL(fileURLWithPath: directory).deletingLastPathComponent().deletingLastPathComponent().path
                + "/sources"
            try FileManager.default.createDirectory(atPath: sources, withIntermediateDirectories: true)
            // A file for every three calls of the other workloads: each send and receive makes many operations.
            for index in 0..<max(2, min(count / 3, 30)) {
                let path = sources + "/file\(index).bin"
                try Data(PowerLossMessage.fileBytes(index: index)).write(to: URL(fileURLWithPath: path))
                let transfer = try transfers.send(file: path, metadata: ["index": "\(index)"])
                mark("sent \(index) \(transfer.id)")
            }
            let received = Locked<[String]>([])
            let receiver = try transfers.receive(consumer: "r", into: directory + "/inbox", on: .notifierThread) {
                file in
                received.withLock { $0.append(file.transfer.name) }
                mark("received \(file.transfer.name)")
            }
            receiver.cancel()
        }
    }

    private func mark(_ text: String) {
        let bytes = Array(text.utf8)
        _ = bytes.withUnsafeBytes { write(-1, $0.baseAddress, $0.count) }
    }
}

/// A message whose body can be checked against its index.
struct PowerLossMessage: Codable, Sendable, Equatable {
    var index: Int
    var check: String

    init(index: Int) {
        self.index = index
        check = Self.check(for: index)
    }

    /// 60 to 250 bytes, and every fifth one 1,500: more than the slots of a mailbox made for a smaller one.
    static func check(for index: Int) -> String {
        String(repeating: String(index % 10), count: index % 5 == 4 ? 1500 : 60 + (index * 37) % 190)
    }

    var isIntact: Bool { check == Self.check(for: index) }

    /// The mailbox the workload passes message `index` to: "a" twice, then "b", then "c".
    static func mailbox(for index: Int) -> String {
        ["a", "a", "b", "c"][index % 4]
    }

    /// The queue workload's payload: 100 bytes, the index then bytes derived from it.
    static func queuePayload(index: Int) -> Data {
        var bytes = [UInt8](repeating: 0, count: 100)
        withUnsafeBytes(of: UInt32(index).littleEndian) { bytes.replaceSubrange(0..<4, with: $0) }
        for position in 4..<100 { bytes[position] = UInt8(truncatingIfNeeded: index &* 7 &+ position) }
        return Data(bytes)
    }

    /// The index of a queue payload, or nil when its bytes are not those of its index.
    static func queueIndex(_ payload: Data) -> Int? {
        guard payload.count == 100 else { return nil }
        let index = payload.prefix(4).enumerated().reduce(0) { $0 | Int($1.element) << (8 * $1.offset) }
        return queuePayload(index: index) == payload ? index : nil
    }

    /// The bytes of the transfer workload's file `index`: sizes from 1 byte to 70 KB, derived from the index.
    static func fileBytes(index: Int) -> [UInt8] {
        let size = [100, 5000, 70_000, 1, 20_000, 4096][index % 6]
        return (0..<size).map { UInt8(truncatingIfNeeded: $0 * 31 + index * 7) }
    }
}

/// The checks of one crash state: the mode's promises, given which calls had returned before the crash.
struct PowerLossCheck {
    var mode: PowerLoss.Mode
    var synchronizes: Bool
    var directory: String
    /// The markers written before the crash point: the calls that had returned.
    var acknowledged: [String]
    /// Counts the states that gave a documented error and took its way forward.
    var recoveries: Counter
    /// The first marker after the crash point: the call that was under way, if any.
    var upcoming: String?
    var count: Int

    static func configuration(_ synchronizes: Bool) -> Wormhole.Configuration {
        var configuration = Wormhole.Configuration()
        configuration.fileOptions.synchronizesWrites = synchronizes
        // The checks count what matters; the library's warnings (a consumer starting over) would only repeat it.
        configuration.logger = Logger(label: "power-loss", factory: { _ in SwiftLogNoOpLogHandler() })
        return configuration
    }

    /// The problems found; empty when every promise holds.
    func run() -> [String] {
        do {
            let wormhole = try Wormhole(directory: directory, configuration: Self.configuration(synchronizes))
            switch mode {
            case .mailbox: return checkMailboxes(wormhole)
            case .queue: return checkQueue(wormhole)
            case .suite: return checkSuite(wormhole)
            case .transfer: return checkTransfers(wormhole)
            }
        } catch {
            return ["the wormhole did not open: \(error)"]
        }
    }

    /// Whether an error is one the documentation promises for damaged files after a power cut without
    /// `synchronizesWrites`.
    private func isDocumentedDamage(_ error: WormholeError) -> Bool {
        [.truncatedMessage, .corruptMessage].contains(error.code)
    }

    /// The numbers after a marker's prefix, in order.
    private func values(_ prefix: String) -> [[String]] {
        acknowledged.filter { $0.hasPrefix(prefix + " ") }.map { $0.split(separator: " ").dropFirst().map(String.init) }
    }

    // MARK: Mailbox

    private func checkMailboxes(_ wormhole: Wormhole) -> [String] {
        var problems: [String] = []
        let passed = values("mailbox")
        for identifier in ["a", "b", "c"] {
            let returned = passed.filter { $0[0] == identifier }.compactMap { Int($0[1]) }
            // The calls that may have been under way: up to the next one after the last that returned.
            let newestPossible = (passed.compactMap { Int($0[1]) }.max() ?? -1) + 1
            do {
                let message = try wormhole.message(withIdentifier: identifier, as: PowerLossMessage.self)
                if let message {
                    if !message.isIntact { problems.append("mailbox \(identifier): message \(message.index) damaged") }
                    if message.index > newestPossible || PowerLossMessage.mailbox(for: message.index) != identifier {
                        problems.append("mailbox \(identifier): message \(message.index) was never passed to it")
                    }
                    if synchronizes, let last = returned.last, message.index < last {
                        problems.append(
                            "mailbox \(identifier): holds \(message.index), but \(last) was passed and synced"
                        )
                    }
                } else if synchronizes, let last = returned.last {
                    problems.append("mailbox \(identifier): empty, but \(last) was passed and synced")
                }
            } catch  where !synchronizes && isDocumentedDamage(error) {
                recoveries.increment()
                // The way forward the documentation gives: the next pass replaces the file.
                do {
                    try wormhole.passMessageObject(PowerLossMessage(index: 1000), identifier: identifier)
                    let again = try wormhole.message(withIdentifier: identifier, as: PowerLossMessage.self)
                    if again?.index != 1000 { problems.append("mailbox \(identifier): a new pass did not replace it") }
                } catch {
                    problems.append("mailbox \(identifier): \(error.code): a new pass failed too: \(error)")
                }
            } catch {
                problems.append("mailbox \(identifier): \(error)")
            }
        }
        return problems
    }

    // MARK: Queue

    private func checkQueue(_ wormhole: Wormhole) -> [String] {
        var problems: [String] = []
        let enqueued = values("enqueued").compactMap { Int($0[0]) }.last ?? 0
        let handled = values("acknowledged").compactMap { Int($0[1]) }.last ?? -1
        // An acknowledgement under way at the crash may have stored its position already.
        let handledAtMost =
            upcoming.flatMap { $0.hasPrefix("acknowledged ") ? Int($0.split(separator: " ")[2]) : nil } ?? handled
        do {
            let queue = try wormhole.queue("jobs")
            // Everything in the log, through a new consumer: a run of what was enqueued, in order, whole, from where
            // reclaiming left off (never past what consumer c had not acknowledged).
            let all = try readAll(queue, consumer: "audit")
            let indices = all.compactMap { $0 }
            guard indices.count == all.count else { return ["the log delivered a damaged record"] }
            if let first = indices.first {
                if indices != Array(first..<first + indices.count) {
                    problems.append("the log holds \(indices.prefix(20)) …, not a run of what was enqueued, in order")
                }
                if first > handledAtMost + 1 { problems.append("the log lost \(first) messages c never handled") }
            }
            let end = (indices.last ?? handled) + 1
            if end > count { problems.append("the log holds messages up to \(end - 1) of \(count)") }
            if synchronizes, end < enqueued {
                problems.append("the log ends at \(end), but \(enqueued) were enqueued and synced")
            }
            // Producers enqueue before consumer c comes back, and another process reclaims space: c gets the rest
            // and the new messages, wherever its position was left; it repeats (without synchronizesWrites) but never
            // skips.
            try queue.enqueueData(contentsOf: (5000..<5005).map(PowerLossMessage.queuePayload(index:)))
            try queue.reclaimSpace()
            let next = try readAll(queue, consumer: "c")
            let nextIndices = next.compactMap { $0 }
            guard nextIndices.count == next.count else { return problems + ["consumer c got a damaged record"] }
            if Array(nextIndices.suffix(5)) != Array(5000..<5005) {
                problems.append("after the crash, consumer c got \(nextIndices.suffix(8)), not the new messages last")
            }
            let before = Array(nextIndices.dropLast(5))
            let expected = Array((before.first ?? end)..<end)
            if before != expected {
                problems.append(
                    "consumer c got \(before.prefix(10)) … before the new messages, not a run up to \(end - 1)"
                )
            }
            let first = before.first ?? end
            if first > handledAtMost + 1 {
                problems.append("consumer c skipped to \(first); it had handled up to \(handled)")
            }
            if synchronizes, first < handled + 1, first < end {
                problems.append("consumer c got \(first) again, acknowledged (synced) through \(handled)")
            }
        } catch {
            problems.append("\(error)")
        }
        return problems
    }

    /// Every record from a consumer's position on, acknowledged as read: each one's index, or nil for a record
    /// whose bytes are not those of an index (damaged).
    private func readAll(_ queue: WormholeQueue, consumer: String) throws -> [Int?] {
        let cursor = try queue.log.openCursor(consumer: consumer)
        var indices: [Int?] = []
        while true {
            let records = try cursor.read(maximumCount: 1000)
            guard let last = records.last else { return indices }
            indices += records.map { PowerLossMessage.queueIndex($0.payload) }
            try cursor.acknowledge(through: last.end)
        }
    }

    // MARK: Suite

    private func checkSuite(_ wormhole: Wormhole) -> [String] {
        let updated = values("suite").compactMap { Int($0[0]) }.last ?? 0
        do {
            let suite = try wormhole.suite("settings")
            let values: SuiteValues
            do {
                values = try suite.snapshot()
            } catch  where !synchronizes && isDocumentedDamage(error) {
                return checkSuiteRecovery(suite, after: error)
            }
            let counter = values["counter", as: Int.self] ?? 0
            var problems: [String] = []
            if counter > updated + 1 { problems.append("counter \(counter), but only \(updated) updates returned") }
            if synchronizes, counter < updated {
                problems.append("counter \(counter), but update \(updated) was synced")
            }
            // Each of k0…k3 holds the last update up to the counter's that set it: no half update, none mixed.
            for key in 0..<4 {
                let expected = stride(from: counter, through: 1, by: -1).first { $0 % 4 == key }
                if values["k\(key)", as: Int.self] != expected {
                    problems.append(
                        "counter \(counter) but k\(key) is \(values["k\(key)", as: Int.self] ?? -1): half an update"
                    )
                }
            }
            for index in stride(from: 8, through: counter, by: 8)
            where values["long\(index)", as: String.self] != PowerLossMessage.longSuiteValue(index) {
                problems.append("counter \(counter) but the long value of update \(index) is missing or damaged")
            }
            return problems
        } catch {
            return ["\(error)"]
        }
    }

    /// A damaged suite: updates must refuse it too (never start over silently), and removing its file, as the error
    /// says, must start it over.
    private func checkSuiteRecovery(_ suite: WormholeSuite, after error: WormholeError) -> [String] {
        recoveries.increment()
        do {
            try suite.set(1, forKey: "after")
            return ["an update of the damaged suite went through, dropping every value"]
        } catch {
            guard let path = error.path, error.code == .corruptMessage || error.code == .truncatedMessage else {
                return ["an update of the damaged suite failed with \(error)"]
            }
            do {
                try FileManager.default.removeItem(atPath: path)
                try suite.set(1, forKey: "after")
                if try suite.snapshot()["after", as: Int.self] != 1 { return ["the suite did not start over"] }
                return []
            } catch {
                return ["the suite did not start over after its file was removed: \(error)"]
            }
        }
    }

    // MARK: Transfers

    private func checkTransfers(_ wormhole: Wormhole) -> [String] {
        var problems: [String] = []
        let sent = values("sent").compactMap { Int($0[0]) }
        // A file handed to the handler is acknowledged when the handler returns: the last one may come again.
        let receivedBefore = values("received").map { $0[0] }
        let acknowledgedBefore = Set(receivedBefore.dropLast())
        let inbox = directory + "/inbox"
        do {
            let transfers = try wormhole.transfers("files")
            let files = Locked<[ReceivedFile]>([])
            let errors = Locked<[String]>([])
            let receiver = try transfers.receive(
                consumer: "r",
                into: inbox,
                on: .notifierThread,
                errorHandler: { error in errors.withLock { $0.append("\(error)") } }
            ) { file in files.withLock { $0.append(file) } }
            receiver.cancel()
            problems += errors.withLock { $0 }.map { "the receiver reported: \($0)" }
            for file in files.withLock({ $0 }) {
                if synchronizes, acknowledgedBefore.contains(file.transfer.name) {
                    problems.append("received \(file.transfer.name) again, acknowledged (synced) before")
                }
                guard FileManager.default.contents(atPath: file.path) != nil else {
                    problems.append("received \(file.transfer.name) at \(file.path), where there is no file")
                    continue
                }
            }
        } catch {
            problems.append("\(error)")
        }
        // Every file in the destination is whole, one that was sent (under its name or NAME (2)…); with
        // synchronizesWrites, every file whose send returned is there, and none twice.
        let names = (try? FileManager.default.contentsOfDirectory(atPath: inbox)) ?? []
        var indices: [Int] = []
        for name in names {
            guard name.hasPrefix("file"), let index = Int(name.dropFirst(4).prefix { $0.isNumber }) else {
                problems.append("the destination holds \(name), never sent")
                continue
            }
            indices.append(index)
            let bytes = FileManager.default.contents(atPath: inbox + "/" + name).map { [UInt8]($0) }
            if bytes != PowerLossMessage.fileBytes(index: index) {
                problems.append("the destination holds \(name) with \(bytes?.count ?? 0) bytes, not the file sent")
            }
        }
        if synchronizes {
            for index in sent where !indices.contains(index) {
                problems.append("file\(index).bin was sent (synced) but is not in the destination after receiving")
            }
            for index in Set(indices) where indices.filter({ $0 == index }).count > 1 {
                problems.append("file\(index).bin is in the destination twice")
            }
        }
        return problems
    }
}

/// A count shared by the checks of one run.
final class Counter {
    private(set) var value = 0
    func increment() { value += 1 }
}

extension PowerLossMessage {
    /// The long value of suite update `index`: 12 KB, so that seven of them pass the 64 KiB after which a suite's log
    /// is compacted.
    static func longSuiteValue(_ index: Int) -> String {
        PowerLossMessage(index: index).check + String(repeating: "-", count: 12_000)
    }
}
