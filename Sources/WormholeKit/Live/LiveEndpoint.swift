import Foundation
import Synchronization
import SystemPackage

/// A listening socket for one identifier, and the thread that serves its connections.
///
/// The thread waits in `poll(2)` on the listening socket, on a wake-up signal that stops it, and on every connection it
/// accepted. A sender keeps its connection for the messages that follow (``DirectoryLiveTransport`` caches it), so a
/// message costs one `send` and one wake-up, not a connection. Packets are read without blocking, so a slow or silent
/// peer holds up nobody; each message is handed to `handle` on the endpoint's thread, with no connection. A request
/// hands its connection over to `handle`, which replies on it and closes it. Connections from
/// another user are refused (`SO_PEERCRED`) unless the directory is shared.
final class LiveEndpoint: Sendable {
    private let directory: DirectoryHandle
    private let name: String
    private let listening: PacketSocket
    private let wake: WakeUpSignal
    private let stopped = Atomic<Bool>(false)
    private let batchCapacity: Int

    /// - Parameters:
    ///   - prefix: The socket file's name prefix (``LiveSocket/prefix(for:)`` for a listener,
    ///     ``LiveSocket/responderPrefix(for:)`` for a responder).
    ///   - handle: Called on the endpoint's thread with each packet; `connection` is nil for a message (the endpoint
    ///     keeps the connection), and for a request the connection to reply on, which `handle` must close.
    ///   - batchCapacity: The packets one receive can take: a burst is read in few calls, and a lone packet in one.
    ///     A responder's connection carries one request, so 1 is enough for it.
    init(
        directory: DirectoryHandle,
        name prefix: String,
        identifier: String,
        batchCapacity: Int = 8,
        handle: @escaping @Sendable (LivePacket, _ connection: PacketSocket?) -> Void
    ) throws(WormholeError) {
        self.directory = directory
        self.batchCapacity = batchCapacity
        let name = prefix + "\(ProcessFacts.processID).\(UInt32.random(in: 0...UInt32.max))"
        self.name = name
        let socket: PacketSocket
        switch PacketSocket.make() {
        case .success(let value): socket = value
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "create a socket", identifier: identifier, path: nil)
        }
        // Bound and listening under a name no sender looks for, then renamed into place: a sender that found the
        // socket bound but not yet listening would take it for a dead one and remove it.
        let staging = ".b." + name
        guard let address = UnixSocketAddress(directory: directory, name: staging) else {
            socket.close()
            throw WormholeError(.ioFailure, "The socket address is too long.", identifier: identifier)
        }
        let listened = socket.bind(to: address)
            .flatMap { directory.setMode(ofEntry: staging, to: directory.filePermissions) }
            .flatMap { socket.listen(backlog: 128) }
            .flatMap { () -> Result<Void, Errno> in
                if let group = directory.group { _ = directory.setGroup(ofEntry: staging, to: group) }
                return directory.moveEntry(staging, to: directory, as: name)
            }
        if case .failure(let errno) = listened {
            socket.close()
            _ = directory.removeFile(named: staging)
            throw WormholeError.fileSystem(
                errno,
                "listen on a socket",
                identifier: identifier,
                path: directory.filePath(name)
            )
        }
        let wake: WakeUpSignal
        do throws(Errno) {
            wake = try WakeUpSignal()
        } catch {
            socket.close()
            _ = directory.removeFile(named: name)
            throw WormholeError.fileSystem(error, "create a wake-up descriptor", identifier: identifier, path: nil)
        }
        listening = socket
        self.wake = wake
        let trustsOthers = directory.trustsOtherOwners
        Thread { [self] in
            nameCurrentThread("wh-live")
            serve(trustsOthers: trustsOthers, handle: handle)
        }.start()
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

    private func serve(
        trustsOthers: Bool,
        handle: @escaping @Sendable (LivePacket, PacketSocket?) -> Void
    ) {
        // Kept between waits: a wait allocates nothing.
        var descriptors = PollSet(capacity: 16)
        descriptors.append(listening.rawValue)
        descriptors.append(wake.pollDescriptor)
        // One batch for every connection: a packet is copied out of it before the next receive.
        let batch = PacketBatch(capacity: batchCapacity, slotSize: LiveSocket.receiveBufferSize)
        // The sender of the last packet, on any connection: while packets come from one sender, its name is
        // compared, not decoded again.
        var knownSender: String?
        defer {
            // Senders see their cached connection closed and drop it.
            for index in Self.firstConnectionIndex..<descriptors.count {
                PacketSocket(rawValue: descriptors.descriptor(at: index)).close()
            }
            listening.close()
        }
        while !stopped.load(ordering: .acquiring) {
            guard case .success = descriptors.wait(milliseconds: -1) else { return }
            if descriptors.isReady(at: Self.wakeIndex) { return }
            descriptors.retain(from: Self.firstConnectionIndex) { descriptor, isReady in
                guard isReady else { return true }
                let connection = PacketSocket(rawValue: descriptor)
                switch drain(connection, into: batch, knownSender: &knownSender, handle: handle) {
                case .open: return true
                case .closed:
                    connection.close()
                    return false
                case .handedOver: return false
                }
            }
            if descriptors.isReady(at: Self.listeningIndex), let connection = accept(trustsOthers: trustsOthers) {
                descriptors.append(connection.rawValue)
            }
        }
    }

    private func accept(trustsOthers: Bool) -> PacketSocket? {
        guard case .success(let connection) = listening.accept() else { return nil }
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
