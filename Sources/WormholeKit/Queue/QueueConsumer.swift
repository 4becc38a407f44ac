#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import Synchronization

/// A consumer's stored position: 16 bytes, `WHQC`, a CRC-32C of the offset, the offset (little-endian).
final class QueueCursorFile: Sendable {
    private static let magic: UInt32 = 0x4351_4857  // "WHQC"
    private let descriptor: Int32
    let name: String
    let path: String

    init(directory: DirectoryHandle, name: String, create: Bool) throws(WormholeError) {
        try MessageIdentifier.validate(name)
        self.name = name
        self.path = directory.filePath(name)
        let file: OwnedDescriptor
        do {
            file = try directory.openFile(named: name, flags: O_RDWR | (create ? O_CREAT : 0))
        } catch {
            throw WormholeError.fileSystem(error, "open the position of consumer \(name)", path: directory.filePath(name))
        }
        guard try directory.trustedStatus(of: file.descriptor, name: name, identifier: nil) != nil else {
            throw WormholeError(.ioFailure, "The consumer's position file was removed while opening it.", path: path)
        }
        descriptor = file.release()
    }

    deinit { _ = close(descriptor) }

    /// The stored offset, or nil for a consumer that has not handled anything yet.
    func read() throws(WormholeError) -> UInt64? {
        let bytes: [UInt8]
        switch Descriptor(rawValue: descriptor).read(count: 16, at: 0) {
        case .success(let read): bytes = read
        case .failure(let errno): throw WormholeError.fileSystem(errno, "read the position of consumer \(name)", path: path)
        }
        guard let position = Self.decode(bytes) else {
            throw WormholeError(
                .corruptMessage,
                "The position of consumer \(name) is damaged. Remove the file to start that consumer over from the "
                    + "oldest message kept.",
                path: path)
        }
        return position.offset
    }

    /// Decodes a position file's bytes: `.some(nil)` for an empty file, nil for damaged bytes.
    static func decode(_ bytes: [UInt8]) -> (offset: UInt64?, Void)? {
        if bytes.isEmpty { return (nil, ()) }
        let slice = bytes[...]
        guard bytes.count == 16, slice.load(at: 0) as UInt32 == magic,
            slice.load(at: 4) as UInt32 == CRC32C.checksum(bytes[8..<16])
        else { return nil }
        return (slice.load(at: 8), ())
    }

    /// A position file's bytes.
    static func encode(_ offset: UInt64) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 16)
        bytes.store(magic, at: 0)
        bytes.store(offset, at: 8)
        bytes.store(CRC32C.checksum(bytes[8..<16]), at: 4)
        return bytes
    }

    func write(_ offset: UInt64) throws(WormholeError) {
        let bytes = Self.encode(offset)
        if case .failure(let errno) = Descriptor(rawValue: descriptor).write(bytes, at: 0) {
            throw WormholeError.fileSystem(errno, "store the position of consumer \(name)", path: path)
        }
    }

    /// When the position was last stored: how recently the consumer was seen.
    var lastWritten: Date? {
        var raw = stat()
        guard fstat(descriptor, &raw) == 0, raw.st_size > 0 else { return nil }
        return Date(timeIntervalSince1970: Double(raw.st_mtim.tv_sec) + Double(raw.st_mtim.tv_nsec) / 1e9)
    }
}

/// A consumer's reader and position, used by one delivery at a time.
final class QueueConsumerState: @unchecked Sendable {
    // Guarded by QueueConsumer's lock (or used by one iterator at a time): never touched concurrently.
    let queue: WormholeQueue
    let cursor: QueueCursorFile
    var reader: QueueReader
    var sinceReclaim: UInt64 = 0

    init(queue: WormholeQueue, name: String) throws(WormholeError) {
        self.queue = queue
        cursor = try QueueCursorFile(directory: queue.consumers, name: name, create: true)
        let stored = try cursor.read()
        if stored == nil { try cursor.write(0) }  // registered now: reclaiming waits for this consumer from here on
        let start = stored ?? 0
        reader = QueueReader(descriptor: try queue.openForReading(), position: start)
    }

    deinit { _ = close(reader.descriptor) }

    /// Stores the position past a handled message; reclaims space now and then.
    func acknowledge(_ item: QueueReader.Item) throws(WormholeError) {
        try acknowledge(from: item.offset, through: item.end)
    }

    /// Stores the position past handled messages from `start` to `end`, with one write.
    func acknowledge(from start: UInt64, through end: UInt64) throws(WormholeError) {
        try cursor.write(end)
        reader.advance(to: end)
        sinceReclaim += end - start
        if sinceReclaim > 4 << 20 {
            sinceReclaim = 0
            try queue.reclaimSpace()
        }
    }

    /// Watches for appends: the log file itself, or the wormhole's notifier.
    func observe(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        switch queue.wakeSource {
        case .notifier(let notifier):
            return try notifier.observe("queue." + queue.identifier, handler: handler)
        case .logFile(let strategy):
            let path = queue.logPath
            let descriptor = reader.descriptor
            let pollSize: @Sendable () -> [UInt8]? = {
                var raw = stat()
                guard fstat(descriptor, &raw) == 0 else { return nil }
                return PollingMonitor.token(UInt64(raw.st_size))
            }
            switch strategy {
            case .polling(let interval):
                return PollingMonitor.shared.observe(probe: pollSize, interval: interval, handler: handler)
            case .inotify, .automatic:
                #if os(Linux) || os(Android)
                do {
                    let (directory, name) = (queue.directory, queue.logName)
                    return try InotifyMonitor.shared.observe(
                        path: path, create: { directory.touchFile(named: name) }, handler: handler)
                } catch where strategy == .automatic {
                    queue.logger.warning(
                        "inotify is unavailable; polling the queue instead", metadata: ["cause": "\(error.message)"])
                }
                #endif
                return PollingMonitor.shared.observe(
                    probe: pollSize, interval: DirectoryNotifier.fallbackPollingInterval, handler: handler)
            }
        }
    }
}

/// An identifier of the calling thread.
func currentThreadID() -> UInt {
    #if canImport(Darwin)
    UInt(bitPattern: pthread_self())
    #else
    UInt(pthread_self())
    #endif
}

/// A running queue consumer; it stops when cancelled or released.
public final class QueueConsumer: Sendable {
    private let state: Locked<QueueConsumerState>
    private let schedule: @Sendable (@escaping @Sendable () -> Void) -> Void
    /// Hands over a batch of messages; false when they were not handled (and stay unacknowledged).
    private let deliver: @Sendable ([QueueReader.Item]) -> Bool
    /// The most messages in one batch: 1 for a handler of single messages.
    private let batchSize: Int
    private let reportError: @Sendable (WormholeError) -> Void
    private let observation = Locked<NotifierObservation?>(nil)
    private let cancelled = Atomic<Bool>(false)
    private let scheduled = Atomic<Bool>(false)
    /// The thread delivering right now, so that `cancel()` called from a handler does not wait for itself.
    private let deliveringThread = Atomic<UInt>(0)
    /// The consumer's name.
    public let name: String

    init(
        state: QueueConsumerState, execution: CallbackExecution, batchSize: Int,
        deliver: @escaping @Sendable ([QueueReader.Item]) -> Bool,
        reportError: @escaping @Sendable (WormholeError) -> Void
    ) {
        self.name = state.cursor.name
        self.batchSize = max(1, batchSize)
        self.state = Locked(state)
        self.schedule = execution.makeScheduler(label: "wormhole.queue.\(state.queue.identifier).\(state.cursor.name)")
        self.deliver = deliver
        self.reportError = reportError
    }

    func start() throws(WormholeError) {
        let watch = try state.withLock { (state) throws(WormholeError) in
            try state.observe { [weak self] in self?.wake() }
        }
        observation.withLock { $0 = watch }
        wake()  // catch up on what was appended while this consumer was away
    }

    /// The offset of the next message this consumer will handle.
    public var position: UInt64 { state.withLock { $0.reader.position } }

    /// Stops the consumer. A message being handled finishes first, and is acknowledged if its handler returns:
    /// when `cancel()` returns (from outside a handler), no message is left handled but unacknowledged.
    public func cancel() {
        cancelled.store(true, ordering: .relaxed)
        let watch = observation.withLock { watch in
            defer { watch = nil }
            return watch
        }
        watch?.cancel()
        // Wait for a delivery under way, unless this is that delivery's own thread.
        if deliveringThread.load(ordering: .acquiring) != currentThreadID() {
            state.withLock { _ in }
        }
    }

    deinit { cancel() }

    private func wake() {
        // Coalesce: one pass reads everything appended so far.
        guard !scheduled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        schedule { [self] in
            scheduled.store(false, ordering: .releasing)
            deliverPending()
        }
    }

    private func deliverPending() {
        state.withLock { state in
            deliveringThread.store(currentThreadID(), ordering: .releasing)
            defer { deliveringThread.store(0, ordering: .releasing) }
            do throws(WormholeError) {
                while !cancelled.load(ordering: .relaxed) {
                    let start = state.reader.position
                    var batch: [QueueReader.Item] = []
                    do throws(WormholeError) {
                        // A batch also ends past one read chunk of bytes, so that it stays in the CPU's caches.
                        while batch.count < batchSize, state.reader.position - start < QueueReader.chunkSize,
                            let item = try state.reader.next()
                        {
                            batch.append(item)
                            state.reader.advance(to: item.end)
                        }
                    } catch {
                        state.reader.rewind(to: start)
                        throw error
                    }
                    guard let last = batch.last else { return }
                    guard deliver(batch) else {
                        state.reader.rewind(to: start)
                        return
                    }
                    try state.acknowledge(from: start, through: last.end)
                }
            } catch {
                reportError(error)
            }
        }
    }
}

/// The messages of a queue a consumer has not handled, then each new one; see
/// ``WormholeQueue/messages(consumer:as:)``. Iterate it once.
public struct QueueSequence<Message: Decodable & Sendable>: AsyncSequence, Sendable {
    public typealias Element = QueueMessage<Message>

    /// The consumer's state behind its lock.
    final class Guarded: Sendable {
        let state: Locked<QueueConsumerState>
        init(_ state: QueueConsumerState) { self.state = Locked(state) }
    }

    final class Feed: Sendable {
        let state: Result<Guarded, WormholeError>
        let observation: NotifierObservation?
        init(state: Result<Guarded, WormholeError>, observation: NotifierObservation?) {
            self.state = state
            self.observation = observation
        }
        deinit { observation?.cancel() }
    }

    private let feed: Feed
    private let wakes: AsyncStream<Void>

    init(queue: WormholeQueue, consumer: String) {
        let (wakes, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        self.wakes = wakes
        do throws(WormholeError) {
            let state = try QueueConsumerState(queue: queue, name: consumer)
            let observation = try state.observe { continuation.yield() }
            feed = Feed(state: .success(Guarded(state)), observation: observation)
        } catch {
            feed = Feed(state: .failure(error), observation: nil)
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(feed: feed, wakes: wakes.makeAsyncIterator())
    }

    /// The iterator; asking for the next message acknowledges the previous one.
    public struct AsyncIterator: AsyncIteratorProtocol {
        let feed: Feed
        var wakes: AsyncStream<Void>.AsyncIterator
        var unacknowledged: QueueReader.Item?

        /// The next message; throws a ``WormholeError`` when the queue cannot be read or a message decoded.
        public mutating func next() async throws -> QueueMessage<Message>? {
            let guarded = try feed.state.get()
            while true {
                // Reading the page cache does not wait; waiting for appends happens on the AsyncStream below.
                let previous = unacknowledged
                let item: QueueReader.Item? = try guarded.state.withLock { (state) throws(WormholeError) in
                    if let previous { try state.acknowledge(previous) }
                    return try state.reader.next()
                }
                unacknowledged = nil
                if let item {
                    let coder = guarded.state.withLock { $0.queue.coder }
                    let value = try coder.decode(Message.self, from: item.record.payload)
                    unacknowledged = item
                    return QueueMessage(item: item, value: value)
                }
                guard await wakes.next() != nil, !Task.isCancelled else { return nil }
            }
        }
    }
}
