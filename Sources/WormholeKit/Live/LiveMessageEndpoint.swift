import Foundation
import Synchronization
import SystemPackage

/// A listener's datagram socket for one identifier, and the thread that receives on it.
///
/// Every sender's messages arrive on this one socket, so the thread waits in a single blocking receive
/// (`recvmmsg` with `MSG_WAITFORONE`): no `poll` of a set of connections, no listening socket to accept on. A lone
/// message costs one call, a burst few. Each message is handed to `handle` on the endpoint's thread.
///
/// The thread is a ``CallbackDriver``, as ``LiveEndpoint``'s is: callbacks that `handle` schedules with the default
/// execution (``CallbackExecution/automatic``) run on it once the packets received are handed over. The socket must go
/// on being read, or its queue fills and senders wait: a backlog of quick callbacks that has held the thread for
/// ``CallbackDriver/passBudget`` goes on on the listener's queue, and a callback that blocks for
/// ``CallbackDriver/blockedAfter`` has the endpoint's work taken over by a new thread, which goes on receiving.
///
/// Only whoever may write to the socket file can send to it: the file is its owner's alone unless the directory is
/// shared (``LiveSocket/publish(_:in:prefix:identifier:)``).
final class LiveMessageEndpoint: Sendable {
    private let directory: DirectoryHandle
    private let name: String
    private let socket: PacketSocket
    /// A socket connected to ``socket``, on which ``stop()`` sends an empty datagram that ends the thread's wait.
    /// (Darwin does not end a wait on a datagram socket that is shut down; a datagram ends it everywhere.)
    private let waker: LiveConnection
    private let changes: LiveChangeCounter?
    private let stopped = Atomic<Bool>(false)

    /// - Parameters:
    ///   - changes: The directory's count of changes, which the socket's coming and going add to.
    ///   - handle: Called on the endpoint's thread with each message packet.
    init(
        directory: DirectoryHandle,
        naming: LiveSocketNaming,
        changes: LiveChangeCounter?,
        identifier: String,
        handle: @escaping @Sendable (LivePacket) -> Void
    ) throws(WormholeError) {
        self.directory = directory
        self.changes = changes
        let (socket, name) = try LiveSocket.publish(
            .datagrams,
            in: directory,
            naming: naming,
            prefix: naming.listenerPrefix(for: identifier),
            identifier: identifier
        )
        let waker: PacketSocket
        switch UnixSocketAddress(directory: directory, name: name).map({
            PacketSocket.connected(to: $0, kind: .datagrams)
        }) {
        case .success(let connected)?:
            waker = connected
        case .failure(let errno)?:
            socket.close()
            _ = directory.removeFile(named: name)
            throw WormholeError.fileSystem(errno, "connect to a socket", identifier: identifier, path: nil)
        case nil:
            socket.close()
            _ = directory.removeFile(named: name)
            throw WormholeError(.ioFailure, "The socket's address is too long.", identifier: identifier)
        }
        self.socket = socket
        self.name = name
        self.waker = LiveConnection(waker)
        // Counted once the socket is in place: a sender that sees the new count finds it.
        changes?.increment()
        let receiving = ReceivingState(handle: handle)
        CallbackDriver.startThread(named: "wh-live", handsBacklogsToQueues: true) { [self] driver in
            receive(receiving, driver: driver)
        }
    }

    /// Removes the socket file and stops the thread, which closes the socket: senders waiting for room in its queue
    /// then fail, and drop it. Idempotent.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        _ = directory.removeFile(named: name)
        changes?.increment()
        // Without waiting: a full queue means the thread has datagrams to read, after which it sees `stopped`.
        _ = waker.socket.send(
            head: UnsafeRawBufferPointer(start: nil, count: 0),
            body: .init(start: nil, count: 0),
            waiting: false
        )
    }

    deinit { stop() }

    /// What the receiving thread works with. One thread at a time uses it: the receiving one, or, once a callback
    /// blocked that one, the thread that took over its work (the blocked one touches it no more).
    private final class ReceivingState: @unchecked Sendable {
        /// Room for a burst: a packet is copied out of it before the next receive.
        let batch = PacketBatch(capacity: 8, slotSize: LiveSocket.receiveBufferSize)
        /// The sender of the last packet: while packets come from one sender, its name is compared, not decoded again.
        var knownSender: String?
        let handle: @Sendable (LivePacket) -> Void

        init(handle: @escaping @Sendable (LivePacket) -> Void) { self.handle = handle }
    }

    /// Receives until stopped, on a driver's thread (``CallbackDriver/startThread(named:handsBacklogsToQueues:handingOver:_:)``),
    /// which a new one takes over when a callback blocks.
    private func receive(_ receiving: ReceivingState, driver: CallbackDriver) {
        defer {
            // A thread that was taken over leaves the socket to the one that took over. (`stop()` never uses it:
            // it wakes this thread through `waker`.)
            if !driver.isReplaced { socket.close() }
        }
        // The state is touched only between the driver's runs of callbacks: the watchdog replaces the driver while
        // one runs, and a replaced thread stops at the loop's condition.
        while !driver.isReplaced && !stopped.load(ordering: .acquiring) {
            let count: Int
            switch socket.receiveWaiting(into: receiving.batch) {
            case .success(let received): count = received
            case .failure:
                // Out of memory: listening must not stop unseen, so it waits a moment and tries again.
                usleep(10_000)
                continue
            }
            for index in 0..<count {
                // An empty datagram (the waker's), one cut to its slot, or one that is not a message packet is not
                // ours to deliver.
                guard let bytes = receiving.batch.wholePacket(at: index),
                    let packet = LivePacket(bytes, knownSender: receiving.knownSender), packet.kind == .message
                else { continue }
                receiving.knownSender = packet.sender
                receiving.handle(packet)
            }
            driver.runDeferred()
        }
    }
}
