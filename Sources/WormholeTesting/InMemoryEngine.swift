import Dispatch
import Foundation
import Synchronization
import WormholeKit

/// An engine that keeps every mode in memory: test your code's mailboxes, queues, suites, live messages and file
/// transfers with no files.
///
/// Wormholes made on one engine behave as processes sharing one directory: give each its own sender.
///
/// ```swift
/// let engine = InMemoryEngine()
/// let app = Wormhole(engine: engine, sender: "app")
/// let widget = Wormhole(engine: engine, sender: "widget")
/// try app.queue("jobs").enqueue("first job")
/// let jobs = try await widget.queue("jobs").messages(consumer: "worker", as: String.self)
/// for try await job in jobs {
///     print(job.value, "from", job.sender)   // "first job from app"
///     try await jobs.acknowledge(job)
///     break
/// }
/// ```
///
/// It keeps every promise of the package's contract suites, which run against it as against the directory engine:
/// use it to test your logic, and the directory engine to test what crosses processes. Only this process sees it.
public final class InMemoryEngine: WormholeEngine {
    public let transiting: any Transiting
    public let notifier: any Notifier
    private let queues = Locked<[String: InMemoryQueueLog.Storage]>([:])
    private let suites = Locked<[String: InMemorySuiteStore]>([:])
    private let stagingAreas = Locked<[String: InMemoryTransferStaging]>([:])
    private let endpoints = InMemoryLiveTransport.Registry()

    public var description: String { "in-memory" }

    /// Creates an empty engine.
    ///
    /// - Parameters:
    ///   - transiting: Where mailboxes are kept; a new ``InMemoryTransiting`` by default.
    ///   - notifier: How listeners of every mode are woken; an ``InMemoryNotifier`` by default. Give a
    ///     ``ManualNotifier`` to decide when they run.
    public init(transiting: any Transiting = InMemoryTransiting(), notifier: any Notifier = InMemoryNotifier()) {
        self.transiting = transiting
        self.notifier = notifier
    }

    public func queueLog(
        _ identifier: String,
        sender: String,
        retention: Duration
    ) throws(WormholeError) -> any QueueLog {
        try MessageIdentifier.validate(identifier)
        let storage = queues.withLock { queues in
            if let existing = queues[identifier] { return existing }
            let storage = InMemoryQueueLog.Storage()
            queues[identifier] = storage
            return storage
        }
        return InMemoryQueueLog(
            identifier: identifier,
            sender: sender,
            retention: retention,
            storage: storage,
            notifier: notifier
        )
    }

    public func suiteStore(_ name: String) throws(WormholeError) -> any SuiteStore {
        try MessageIdentifier.validate(name)
        return suites.withLock { suites in
            if let existing = suites[name] { return existing }
            let store = InMemorySuiteStore(name: name, notifier: notifier)
            suites[name] = store
            return store
        }
    }

    public func liveTransport(sender: String) throws(WormholeError) -> any LiveTransport {
        InMemoryLiveTransport(sender: sender, registry: endpoints)
    }

    public func transferStaging(_ identifier: String) throws(WormholeError) -> any TransferStaging {
        try MessageIdentifier.validate(identifier)
        return stagingAreas.withLock { areas in
            if let existing = areas[identifier] { return existing }
            let area = InMemoryTransferStaging()
            areas[identifier] = area
            return area
        }
    }
}

// MARK: - Queues

/// A queue's records and consumers' positions in memory; a record's offset is its index.
final class InMemoryQueueLog: QueueLog {
    final class Storage: Sendable {
        struct State {
            var records: [QueueRecord] = []
            /// Records before this index were reclaimed.
            var firstKept = 0
            var positions: [String: (offset: UInt64, seen: ContinuousClock.Instant)] = [:]
        }
        let state = Locked(State())
    }

    let identifier: String
    let sender: String
    let retention: Duration
    let storage: Storage
    let notifier: any Notifier

    init(identifier: String, sender: String, retention: Duration, storage: Storage, notifier: any Notifier) {
        self.identifier = identifier
        self.sender = sender
        self.retention = retention
        self.storage = storage
        self.notifier = notifier
    }

    var notificationName: String { "queue." + identifier }

    func append(contentsOf payloads: some Sequence<Data>) throws(WormholeError) {
        let batch = Array(payloads)
        for payload in batch where payload.count > 64 << 20 {
            throw WormholeError(
                .messageTooLarge,
                "The message is \(payload.count) bytes; a queue accepts up to 64 MiB.",
                identifier: identifier
            )
        }
        guard !batch.isEmpty else { return }
        let now = Int64(Date().timeIntervalSince1970 * 1e9)
        storage.state.withLock { state in
            for payload in batch {
                let offset = UInt64(state.records.count)
                state.records.append(
                    QueueRecord(
                        offset: offset,
                        end: offset + 1,
                        sender: sender,
                        timestampNanoseconds: now,
                        payload: payload
                    )
                )
            }
        }
        try notifier.post(notificationName)
    }

    func openCursor(consumer: String) throws(WormholeError) -> any QueueCursor {
        try MessageIdentifier.validate(consumer)
        storage.state.withLock { state in
            if state.positions[consumer] == nil {
                state.positions[consumer] = (UInt64(state.firstKept), .now)
            }
        }
        return InMemoryQueueCursor(log: self, consumer: consumer)
    }

    func status() throws(WormholeError) -> QueueStatus {
        storage.state.withLock { state in
            let end = UInt64(state.records.count)
            let consumers = state.positions.keys.sorted().map { name in
                let offset = state.positions[name]!.offset
                let pending = state.records[Int(min(offset, end))...]
                return QueueStatus.Consumer(
                    name: name,
                    offset: offset,
                    lagBytes: UInt64(pending.reduce(0) { $0 + $1.payload.count }),
                    lagMessages: pending.count
                )
            }
            return QueueStatus(identifier: identifier, endOffset: end, consumers: consumers)
        }
    }

    func reclaimSpace() throws(WormholeError) {
        storage.state.withLock { state in
            let now = ContinuousClock.now
            state.positions = state.positions.filter { now - $0.value.seen <= retention }
            guard let minimum = state.positions.values.map(\.offset).min() else { return }
            // Reclaimed records keep their offsets; their payloads are dropped.
            for index in state.firstKept..<Int(minimum) {
                state.records[index].payload = Data()
            }
            state.firstKept = max(state.firstKept, Int(minimum))
        }
    }
}

/// A consumer's position in an in-memory queue.
final class InMemoryQueueCursor: QueueCursor {
    let log: InMemoryQueueLog
    let consumer: String
    /// Its calls take a lock held only for moments.
    var callsMayWait: Bool { false }

    init(log: InMemoryQueueLog, consumer: String) {
        self.log = log
        self.consumer = consumer
    }

    var position: UInt64 {
        log.storage.state.withLock { $0.positions[consumer]?.offset ?? UInt64($0.firstKept) }
    }

    func read(maximumCount: Int) throws(WormholeError) -> [QueueRecord] {
        log.storage.state.withLock { state in
            let start = Int(state.positions[consumer]?.offset ?? UInt64(state.firstKept))
            guard start < state.records.count else { return [] }
            return Array(state.records[start..<min(state.records.count, start + max(1, maximumCount))])
        }
    }

    func acknowledge(through end: UInt64) throws(WormholeError) {
        log.storage.state.withLock { state in
            let current = state.positions[consumer]?.offset ?? 0
            state.positions[consumer] = (max(current, end), .now)
        }
    }

    func observeAppends(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        try log.notifier.observe(log.notificationName, handler: handler)
    }
}

// MARK: - Suites

/// A suite's values and every change, in memory.
final class InMemorySuiteStore: SuiteStore {
    let name: String
    let notifier: any Notifier
    private let state = Locked<(current: SuiteState, log: [SuiteChange])>((SuiteState(), []))
    /// How many changes are kept, as a directory suite keeps 64.
    static let logLimit = 64

    init(name: String, notifier: any Notifier) {
        self.name = name
        self.notifier = notifier
    }

    func read() throws(WormholeError) -> SuiteState { state.withLock { $0.current } }

    func update(
        sender: String,
        direction: String?,
        _ body: (inout SuiteValues) throws(WormholeError) -> Void
    ) throws(WormholeError) -> SuiteChange? {
        let change = try state.withLock { (state) throws(WormholeError) -> SuiteChange? in
            var values = state.current.values
            try body(&values)
            let keys = Set(values.keys).union(state.current.values.keys).filter {
                values.json(forKey: $0) != state.current.values.json(forKey: $0)
            }
            guard !keys.isEmpty else { return nil }
            var changed = SuiteValues()
            for key in keys {
                if let json = values.json(forKey: key) { changed.setJSON(json, forKey: key) }
            }
            let change = SuiteChange(
                version: state.current.version + 1,
                keys: keys,
                sender: sender,
                direction: direction,
                timestampNanoseconds: Int64(Date().timeIntervalSince1970 * 1e9),
                values: changed
            )
            state.current = SuiteState(version: change.version, values: values)
            state.log.append(change)
            if state.log.count > Self.logLimit { state.log.removeFirst(state.log.count - Self.logLimit) }
            return change
        }
        if change != nil { try notifier.post("suite." + name) }
        return change
    }

    func changes(after version: UInt64) throws(WormholeError) -> (state: SuiteState, changes: [SuiteChange]?) {
        state.withLock { state in
            guard state.current.version > version else { return (state.current, []) }
            let logged = state.log.filter { $0.version > version }
            guard logged.first?.version == version + 1 else { return (state.current, nil) }
            return (state.current, logged)
        }
    }

    func observe(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        try notifier.observe("suite." + name, handler: handler)
    }
}

// MARK: - Live messages

/// Live messages and requests between the wormholes of one in-memory engine.
final class InMemoryLiveTransport: LiveTransport {
    /// The endpoints of an engine, by identifier; each with a serial queue of its own, as a socket has a thread.
    final class Registry: Sendable {
        struct Endpoint {
            let queue: DispatchQueue
            let deliver: @Sendable (LiveMessage) -> Void
        }
        struct Responder {
            let queue: DispatchQueue
            let answer: @Sendable (LiveRequest) -> Void
        }
        struct State {
            var listeners: [String: [UInt64: Endpoint]] = [:]
            var responders: [String: [UInt64: Responder]] = [:]
            var nextID: UInt64 = 1
        }
        let state = Locked(State())
    }

    let sender: String
    let registry: Registry

    init(sender: String, registry: Registry) {
        self.sender = sender
        self.registry = registry
    }

    func send(_ payload: Data, identifier: String) throws(WormholeError) -> Int {
        let endpoints = registry.state.withLock { Array(($0.listeners[identifier] ?? [:]).values) }
        guard !endpoints.isEmpty else {
            throw WormholeError(
                .notReachable,
                "No process is listening for \"\(identifier)\" right now; nothing was sent.",
                identifier: identifier
            )
        }
        let message = LiveMessage(sender: sender, payload: payload)
        for endpoint in endpoints { endpoint.queue.async { endpoint.deliver(message) } }
        return endpoints.count
    }

    func listen(
        identifier: String,
        handler: @escaping @Sendable (LiveMessage) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let endpoint = Registry.Endpoint(queue: DispatchQueue(label: "wormhole.in-memory-live"), deliver: handler)
        let id = registry.state.withLock { state in
            defer { state.nextID += 1 }
            state.listeners[identifier, default: [:]][state.nextID] = endpoint
            return state.nextID
        }
        return NotifierObservation { [registry] in
            registry.state.withLock { $0.listeners[identifier]?[id] = nil }
        }
    }

    func request(_ payload: Data, identifier: String, timeout: Duration) -> Result<Data, WormholeError> {
        guard let responder = registry.state.withLock({ $0.responders[identifier]?.values.randomElement() }) else {
            return .failure(
                WormholeError(
                    .notReachable,
                    "No process answers \"\(identifier)\" right now; nothing was sent.",
                    identifier: identifier
                )
            )
        }
        let answer = Locked<LiveAnswer?>(nil)
        let answered = DispatchSemaphore(value: 0)
        // Made on the responder's queue and held only there: a request its responder drops is released, and fails
        // at once, as a closed connection does on a directory.
        let sender = self.sender
        responder.queue.async {
            responder.answer(
                LiveRequest(sender: sender, payload: payload) { reply in
                    answer.withLock { $0 = reply }
                    answered.signal()
                }
            )
        }
        // Capped at a year: a time-out meaning "as long as it takes" (`.seconds(Int64.max)`) must not overflow.
        let milliseconds = min(max(timeout.milliseconds, 0), 365 * 86_400_000)
        let deadline = DispatchTime.now() + .milliseconds(Int(milliseconds.rounded(.up)))
        guard answered.wait(timeout: deadline) == .success else {
            return .failure(WormholeError(.timedOut, "No reply within \(timeout).", identifier: identifier))
        }
        switch answer.withLock({ $0 }) {
        case .reply(let bytes): return .success(bytes)
        case .failure(let description):
            return .failure(
                WormholeError(.remoteFailure, "The responder failed: \(description)", identifier: identifier)
            )
        case nil:
            return .failure(WormholeError(.remoteFailure, "The responder did not answer.", identifier: identifier))
        }
    }

    func respond(
        identifier: String,
        handler: @escaping @Sendable (LiveRequest) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let responder = Registry.Responder(queue: DispatchQueue(label: "wormhole.in-memory-respond"), answer: handler)
        let id = registry.state.withLock { state in
            defer { state.nextID += 1 }
            state.responders[identifier, default: [:]][state.nextID] = responder
            return state.nextID
        }
        return NotifierObservation { [registry] in
            registry.state.withLock { $0.responders[identifier]?[id] = nil }
        }
    }
}

// MARK: - Transfers

/// Staged files in memory; delivered files are written to the receiver's destination directory.
final class InMemoryTransferStaging: TransferStaging {
    private struct State {
        var staged: [String: Data] = [:]
        var delivered: [String: String] = [:]
    }
    private let state = Locked(State())

    func stage(
        id: String,
        from path: String,
        progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) -> UInt64 {
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw WormholeError(.ioFailure, "Could not open the file to send.", path: path)
        }
        defer { try? handle.close() }
        let total = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? UInt64) ?? 0
        var bytes = Data()
        while true {
            let chunk: Data
            do {
                chunk = try handle.read(upToCount: 1 << 20) ?? Data()
            } catch {
                throw WormholeError(.ioFailure, "Reading the file to send failed: \(error).", path: path)
            }
            if chunk.isEmpty { break }
            bytes.append(chunk)
            progress?(TransferProgress(bytesCopied: UInt64(bytes.count), totalBytes: max(total, UInt64(bytes.count))))
        }
        state.withLock { $0.staged[id] = bytes }
        return UInt64(bytes.count)
    }

    func remove(id: String) throws(WormholeError) -> Bool {
        state.withLock { $0.staged.removeValue(forKey: id) != nil }
    }

    func stagedIDs() throws(WormholeError) -> [String] {
        state.withLock { $0.staged.keys.sorted() }
    }

    func deliver(_ transfer: FileTransfer, into destination: String) throws(WormholeError) -> ReceivedFile? {
        if let path = state.withLock({ $0.delivered[transfer.id] }) {
            return ReceivedFile(transfer: transfer, path: path)
        }
        guard let bytes = state.withLock({ $0.staged[transfer.id] }) else { return nil }
        let files = FileManager.default
        let name = transfer.deliveryName { files.fileExists(atPath: destination + "/" + $0) }
        let path = destination + "/" + name
        guard files.createFile(atPath: path, contents: bytes, attributes: [.posixPermissions: 0o600]) else {
            throw WormholeError(.ioFailure, "Could not write the received file.", path: path)
        }
        state.withLock { state in
            state.staged[transfer.id] = nil
            state.delivered[transfer.id] = path
        }
        return ReceivedFile(transfer: transfer, path: path)
    }

    func finishDelivery(id: String) {
        state.withLock { _ = $0.delivered.removeValue(forKey: id) }
    }

    func removeAbandonedCopies(olderThan age: Duration) throws(WormholeError) {
        // Copies are staged whole or not at all: nothing is ever abandoned in memory.
    }
}
