import Foundation
import Synchronization
import SystemPackage

/// A listening socket for one identifier's responders, and the thread that serves its connections. (A listener of
/// messages has a datagram socket instead: ``LiveMessageEndpoint``.)
///
/// The thread waits in `poll(2)` on the listening socket, on a wake-up signal that stops it, and on every connection it
/// accepted. A requester connects, sends one request and waits for its reply on the same connection. Packets are read
/// without blocking, so a slow or silent peer holds up nobody; a request hands its connection over to `handle`, which
/// replies on it and closes it (a message, which no sender of this release sends here, is handed over with no
/// connection, and a responder ignores it). Connections from another user are refused (`SO_PEERCRED`) unless the
/// directory is shared.
///
/// The thread is a ``CallbackDriver``: callbacks that `handle` schedules with the default execution
/// (``CallbackExecution/automatic``) run on it once the packets waiting are read, with no hand-off to a dispatch queue.
/// The endpoint serves one responder, so such a callback delays only that responder's requests (and a task that prefers
/// ``NotifierTaskExecutor`` and resumes here). The socket must go on being read, or its buffer fills and senders wait:
/// a backlog of quick callbacks that has held the thread for ``CallbackDriver/passBudget`` goes on on the responder's
/// queue (``CallbackDriver/handsBacklogsToQueues``), and a callback that blocks for ``CallbackDriver/blockedAfter``
/// has the endpoint's work taken over by a new thread, which goes on reading the socket; the callbacks that came
/// meanwhile run after it on the blocked thread, and later ones on the responder's queue.
final class LiveEndpoint: Sendable {
    private let directory: DirectoryHandle
    private let name: String
    private let listening: PacketSocket
    private let wake: WakeUpSignal
    private let stopped = Atomic<Bool>(false)

    /// - Parameters:
    ///   - naming: How the directory's sockets are named.
    ///   - prefix: The socket file's name prefix (``LiveSocketNaming/responderPrefix(for:)``).
    ///   - handle: Called on the endpoint's thread with each packet; `connection` is nil for a message (the endpoint
    ///     keeps the connection), and for a request the connection to reply on, which `handle` must close.
    ///   - batchCapacity: The packets one receive can take: a burst is read in few calls, and a lone packet in one.
    ///     A responder's connection carries one request, so 1 is enough for it.
    init(
        directory: DirectoryHandle,
        naming: LiveSocketNaming,
        name prefix: String,
        identifier: String,
        batchCapacity: Int = 8,
        handle: @escaping @Sendable (LivePacket, _ connection: PacketSocket?) -> Void
    ) throws(WormholeError) {
        self.directory = directory
        let (socket, name) = try LiveSocket.publish(
            .sequencedPackets,
            in: directory,
            naming: naming,
            prefix: prefix,
            identifier: identifier
        )
        self.name = name
        let wake: WakeUpSignal
        do throws(Errno) {
            wake = try WakeUpSignal()
        } catch {
            socket.close()
            _ = directory.removeFile(named: name)
            throw WormholeError.fileSystem(error, "create a wake-up descriptor", identifier: identifier, path: nil)
        }
        let wakeDescriptor = wake.pollDescriptor
        listening = socket
        self.wake = wake
        let serving = ServingState(
            listening: socket.rawValue,
            wake: wakeDescriptor,
            batchCapacity: batchCapacity,
            trustsOthers: directory.trustsOtherOwners,
            handle: handle
        )
        CallbackDriver.startThread(named: "wh-live", handsBacklogsToQueues: true) { [self] driver in
            serve(serving, driver: driver)
        }
    }

    /// Stops accepting, closes the connections and removes the socket file. Idempotent.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        _ = directory.removeFile(named: name)
        wake.signal()
    }

    deinit { stop() }

    /// The first entries of the poll set; the connections follow.
    private static let listeningIndex = 0
    private static let wakeIndex = 1
    private static let firstConnectionIndex = 2

    /// What the serving thread works with. One thread at a time uses it: the serving one, or, once a callback blocked
    /// that one, the thread that took over its work (the blocked one touches it no more).
    private final class ServingState: @unchecked Sendable {
        /// The listening socket, the wake-up signal, then the connections; kept between waits, so that a wait
        /// allocates nothing.
        var descriptors = PollSet(capacity: 16)
        /// One batch for every connection: a packet is copied out of it before the next receive.
        let batch: PacketBatch
        /// The sender of the last packet, on any connection: while packets come from one sender, its name is
        /// compared, not decoded again.
        var knownSender: String?
        let trustsOthers: Bool
        let handle: @Sendable (LivePacket, PacketSocket?) -> Void

        init(
            listening: Int32,
            wake: Int32,
            batchCapacity: Int,
            trustsOthers: Bool,
            handle: @escaping @Sendable (LivePacket, PacketSocket?) -> Void
        ) {
            descriptors.append(listening)
            descriptors.append(wake)
            batch = PacketBatch(capacity: batchCapacity, slotSize: LiveSocket.receiveBufferSize)
            self.trustsOthers = trustsOthers
            self.handle = handle
        }
    }

    /// Serves until stopped, on a driver's thread (``CallbackDriver/startThread(named:handsBacklogsToQueues:handingOver:_:)``),
    /// which a new one takes over when a callback blocks.
    private func serve(_ serving: ServingState, driver: CallbackDriver) {
        defer {
            // A thread that was taken over leaves the sockets to the one that took over.
            if !driver.isReplaced {
                // Senders see their cached connection closed and drop it.
                for index in Self.firstConnectionIndex..<serving.descriptors.count {
                    PacketSocket(rawValue: serving.descriptors.descriptor(at: index)).close()
                }
                listening.close()
            }
        }
        // The serving state is touched only between the driver's runs of callbacks: the watchdog replaces the driver
        // while one runs, and a replaced thread stops at the loop's condition.
        while !driver.isReplaced && !stopped.load(ordering: .acquiring) {
            guard case .success = serving.descriptors.wait(milliseconds: -1) else {
                // Out of memory for the wait (ENOMEM, the only error of poll(2) on a set it was given before): listening
                // must not stop unseen, so it waits a moment and tries again.
                usleep(10_000)
                continue
            }
            if serving.descriptors.isReady(at: Self.wakeIndex) { return }
            serving.descriptors.retain(from: Self.firstConnectionIndex) { descriptor, isReady in
                guard isReady else { return true }
                let connection = PacketSocket(rawValue: descriptor)
                switch drain(connection, into: serving.batch, knownSender: &serving.knownSender, handle: serving.handle)
                {
                case .open: return true
                case .closed:
                    connection.close()
                    return false
                case .handedOver: return false
                }
            }
            if serving.descriptors.isReady(at: Self.listeningIndex),
                let connection = accept(trustsOthers: serving.trustsOthers)
            {
                serving.descriptors.append(connection.rawValue)
            }
            driver.runDeferred()
        }
    }

    private func accept(trustsOthers: Bool) -> PacketSocket? {
        let connection: PacketSocket
        switch listening.accept() {
        case .success(let accepted): connection = accepted
        case .failure(.tooManyOpenFiles), .failure(.tooManyOpenFilesInSystem), .failure(.noBufferSpace),
            .failure(.noMemory):
            // Out of descriptors or memory: the connection waits in the backlog, and the listening socket stays
            // ready; a pause keeps this thread from spinning on it until the process frees some.
            usleep(10_000)
            return nil
        case .failure: return nil
        }
        // Another user's process is refused, as a private wormhole's files are.
        if !trustsOthers, (try? connection.peerUserID().get()) != ProcessFacts.effectiveUserID {
            connection.close()
            return nil
        }
        return connection
    }

    private enum ConnectionState { case open, closed, handedOver }

    /// Reads every packet waiting on a connection, without blocking, and hands each over.
    private func drain(
        _ connection: PacketSocket,
        into batch: borrowing PacketBatch,
        knownSender: inout String?,
        handle: @escaping @Sendable (LivePacket, PacketSocket?) -> Void
    ) -> ConnectionState {
        while true {
            let received = connection.receive(into: batch)
            for index in 0..<received.count {
                guard let packet = LivePacket(batch.packet(at: index), knownSender: knownSender) else {
                    return .closed
                }
                knownSender = packet.sender
                if packet.kind == .request {
                    // The reply goes back on this connection: the handler owns it from here.
                    handle(packet, connection)
                    return .handedOver
                }
                handle(packet, nil)
            }
            switch received.then {
            case .drained: return .open
            case .closed: return .closed  // the sender closed it
            case .full: continue
            }
        }
    }
}
