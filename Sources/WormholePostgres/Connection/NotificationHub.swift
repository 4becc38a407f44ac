import Dispatch
import Foundation
import Logging
import NIOCore
import PostgresNIO
import Synchronization
import WormholeKit

/// One engine's `LISTEN` connection: it wakes the observers of names (mailboxes, queues, suites) when a notification
/// arrives on the group's channel, and hands the live endpoints of this process what arrives on the channels of their
/// identifiers (``liveSuffix(for:)``) and the replies to its requests on its own reply channel.
///
/// Notifications are hints; the tables hold the data. So when the connection drops (a server restart, a network
/// cut), the hub reconnects with back-off and then wakes every observer once, which re-reads from its position; the
/// first connection wakes the observers that stopped waiting for it (the server was away when they registered); and
/// every ``safetyPollInterval`` it wakes them all anyway, in case a notification was lost some other way.
///
/// The hub runs on a thread of its own; observers run on a serial queue each, never on the event loop (they call the
/// engine, which blocks).
final class NotificationHub: Sendable {
    /// An observer of a name, coalescing: a wake-up while one is pending adds nothing.
    final class Observer: Sendable {
        let queue: DispatchQueue
        let handler: @Sendable () -> Void
        let pending = Atomic<Bool>(false)
        let cancelled = Atomic<Bool>(false)

        init(label: String, handler: @escaping @Sendable () -> Void) {
            queue = DispatchQueue(label: label)
            self.handler = handler
        }

        func wake() {
            guard !cancelled.load(ordering: .acquiring), !pending.exchange(true, ordering: .acquiringAndReleasing)
            else { return }
            queue.async { [self] in
                pending.store(false, ordering: .releasing)
                guard !cancelled.load(ordering: .acquiring) else { return }
                handler()
            }
        }
    }

    /// A live endpoint of this process, as registered in `wormhole.live_endpoints`.
    struct Endpoint: Sendable {
        let identifier: String
        let kind: String
        let receive: @Sendable (LiveEnvelope) -> Void
    }

    private struct State {
        var observers: [String: [UInt64: Observer]] = [:]
        /// Who takes the records that append notifications of a queue carry, by queue.
        var recordTakers: [String: [UInt64: @Sendable ([QueueRecord]) -> Void]] = [:]
        var endpoints: [String: Endpoint] = [:]
        var nextID: UInt64 = 1
        var started = false
        var closed = false
        /// The backend of the listening connection, while it listens.
        var backendPID: Int32?
        /// The advisory lock the listening session holds while it lives: the `alive_key` of this process's endpoints.
        var aliveKey: Int64?
        var connection: PostgresConnection?
        /// Signalled when the listening connection closes, or the hub does: the listening thread then ends its use.
        var wake: DispatchSemaphore?
        /// How many times the hub has (re)started listening.
        var connections = 0
        /// How many attempts to listen failed (the server away, say): a registration waits for no more than the first.
        var failedAttempts = 0
        /// Why the last attempt to listen failed, until one succeeds: a live endpoint registered meanwhile is pending
        /// only when the server could not be reached, and gets this error otherwise (the schema missing, a role with
        /// no grant), which waiting would not mend.
        var lastFailure: WormholeError?
        /// The observers registered while no listening connection could be made (an attempt failed, or their wait ran out): the
        /// first connection wakes them, as a reconnection wakes every observer, for what was posted before it
        /// listened. (Not the others: each waited for that connection, and was promised only what came after.)
        var unheardObservers: [(name: String, id: UInt64)] = []
        /// The endpoints whose row could not be removed when they stopped (the statement failed while this process
        /// kept listening, so the row still looks alive), or whose registration failed after its row may have been
        /// written: removed again at the listening loop's next tick.
        var unremovedEndpoints: Set<String> = []
        /// How many times in a row removing them failed.
        var failedRemovals = 0
        /// The group's key, as the listening connection read it, and which sealed notifications it takes.
        var seal: NotificationSeal?
        var replayGuard: ReplayGuard?
        /// A rotation hint (`r`) came: the listening loop compares the group's channel at once.
        var rotationHinted = false
    }

    let connections: Connections
    let group: String
    let logger: Logger
    /// Every this often, every observer is woken even without a notification.
    let safetyPollInterval: Duration
    private let state = Locked(State())

    /// The live channels this process listens on, each with the number of its endpoints that need it, and the
    /// listeners on the current connection. Its lock is held across the `LISTEN` round trips, so that registering an
    /// endpoint and reconnecting never miss a channel.
    private struct LiveChannels {
        /// By suffix (``liveSuffix(for:)``): the channel is the group's, as the connection read it, and the suffix.
        var wanted: [String: Int] = [:]
        var connection: PostgresConnection?
        var groupChannel = ""
        var listening: [String: PostgresListenContext] = [:]
    }
    private nonisolated(unsafe) var liveChannels = LiveChannels()
    private let liveChannelsLock = NSLock()
    /// Held while this process's endpoints and their rows change together (a registration, a removal, the rows
    /// written again after a reconnection), so that a row removed is never written back.
    private let endpointRowsLock = NSLock()
    private let listening = Condition()

    init(connections: Connections, group: String, safetyPollInterval: Duration, logger: Logger) {
        self.connections = connections
        self.group = group
        self.safetyPollInterval = safetyPollInterval
        self.logger = logger
    }

    // MARK: Observers and endpoints

    /// Calls `handler` after each notification of `name`; returns once the hub listens (or is reconnecting), or once
    /// an attempt to make its first connection failed (the server away), in which case that connection, when it is
    /// made, wakes `handler` for what was posted meanwhile.
    func observe(_ name: String, handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        let observer = Observer(label: "wormhole.postgres.observer", handler: handler)
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            state.observers[name, default: [:]][state.nextID] = observer
            return state.nextID
        }
        try startListening(untilAnAttemptFails: true)
        state.withLock { state in
            if state.connections == 0, !state.closed { state.unheardObservers.append((name, id)) }
        }
        return NotifierObservation { [weak self] in
            observer.cancelled.store(true, ordering: .releasing)
            self?.state.withLock { _ = $0.observers[name]?.removeValue(forKey: id) }
        }
    }

    /// Hands `handler` the records that the append notifications of `queue` carry, before the queue's observers are
    /// woken, until the observation is cancelled or released.
    func takeRecords(
        of queue: String,
        handler: @escaping @Sendable ([QueueRecord]) -> Void
    ) -> NotifierObservation {
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            state.recordTakers[queue, default: [:]][state.nextID] = handler
            return state.nextID
        }
        return NotifierObservation { [weak self] in
            self?.state.withLock { _ = $0.recordTakers[queue]?.removeValue(forKey: id) }
        }
    }

    /// Registers a live endpoint of this process and returns its id, once the server knows it and this process
    /// listens on the endpoint's channel; or, with the server away, once an attempt to make the listening connection
    /// failed: the endpoint is then pending, and that connection, when it is made, registers it with the others.
    ///
    /// So a listener started while the server is away holds its caller (often a task, on the cooperative pool) for
    /// one attempt to connect, not for the 10 s of ``startListening(untilAnAttemptFails:)``, as an observer does.
    func register(_ endpoint: Endpoint) throws(WormholeError) -> String {
        try startListening(untilAnAttemptFails: true)
        try wantLiveChannel(Self.liveSuffix(for: endpoint.identifier))
        let id: String
        do throws(WormholeError) {
            id = try registerRow(endpoint)
        } catch {
            releaseLiveChannel(Self.liveSuffix(for: endpoint.identifier))
            throw error
        }
        return id
    }

    private func registerRow(_ endpoint: Endpoint) throws(WormholeError) -> String {
        endpointRowsLock.lock()
        defer { endpointRowsLock.unlock() }
        let id = Self.randomID()
        let (listening, failure) = state.withLock { state in
            state.endpoints[id] = endpoint
            return (state.backendPID.flatMap { pid in state.aliveKey.map { (pid, $0) } }, state.lastFailure)
        }
        guard let (pid, key) = listening else {
            if let failure, failure.code != .serverUnavailable {
                state.withLock { _ = $0.endpoints.removeValue(forKey: id) }
                throw failure
            }
            // Pending: the next listening connection writes the rows of every endpoint in `endpoints`, holding
            // `endpointRowsLock` until it has said it listens (``writeEndpointRowsAgain(on:pid:key:)``), so this one
            // is either among them or finds that connection here.
            logger.notice(
                "PostgreSQL engine: the live endpoint of \(endpoint.identifier) is registered once the server is reachable",
                metadata: ["server": "\(connections.server)", "cause": "\(failure?.message ?? "not connected yet")"]
            )
            return id
        }
        do {
            try connections.query(
                """
                INSERT INTO wormhole.live_endpoints
                    (grp, endpoint, identifier, kind, backend_pid, backend_start, alive_key)
                SELECT \(group), \(id), \(endpoint.identifier), \(endpoint.kind), a.pid, a.backend_start, \(key)
                FROM pg_stat_activity a WHERE a.pid = \(pid)
                """,
                doing: "registering a live endpoint"
            )
        } catch {
            // The listening connection went meanwhile: pending, as with the server away; the next connection writes
            // its row again (over one this insert may have committed, with the key of a session that ended).
            let connectionWent = state.withLock { $0.backendPID != pid }
            if connectionWent, error.code == .serverUnavailable { return id }
            // The insert may have committed before its answer was lost (a time-out): its row would look alive.
            state.withLock { state in
                _ = state.endpoints.removeValue(forKey: id)
                state.unremovedEndpoints.insert(id)
            }
            throw error
        }
        return id
    }

    /// Forgets a live endpoint: senders no longer count it once this returns (with the server away: once the server
    /// finds the lost session gone, as for every endpoint of this process).
    func unregister(_ id: String) {
        endpointRowsLock.lock()
        let (endpoint, connected) = state.withLock { ($0.endpoints.removeValue(forKey: id), $0.backendPID != nil) }
        if connected {
            do {
                try connections.query(
                    "DELETE FROM wormhole.live_endpoints WHERE grp = \(group) AND endpoint = \(id)",
                    doing: "removing a live endpoint"
                )
            } catch {
                // The row looks alive while this process's listening session lives: senders would count it, and a
                // request could go to it and wait out its time-out. The listening loop removes it at its next tick.
                logger.debug("PostgreSQL engine: removing live endpoint \(id) failed, tried again shortly: \(error)")
                state.withLock { _ = $0.unremovedEndpoints.insert(id) }
            }
        } else {
            // No listening connection: a statement would wait for the server. The row, if the endpoint has one, is
            // removed at the next connection's first tick.
            state.withLock { _ = $0.unremovedEndpoints.insert(id) }
        }
        endpointRowsLock.unlock()
        if let endpoint { releaseLiveChannel(Self.liveSuffix(for: endpoint.identifier)) }
    }

    // MARK: Live channels

    /// The suffix of the channel of the live messages and requests of `identifier`: `_l` and a 64-bit FNV-1a hash of
    /// the identifier in hexadecimal, after the group's channel. Only the processes with an endpoint for it listen
    /// there, so a live message wakes no other process of the group (an identifier whose hash is the same shares the
    /// channel, and is told apart by the notification). Senders give the suffix; the server puts the group's channel,
    /// as its row names it now, in front (`wormhole.notify_sealed`).
    static func liveSuffix(for identifier: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in identifier.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x100_0000_01b3
        }
        return "_l" + hexadecimal(hash)
    }

    /// The suffix of the channel where replies to `replyEndpoint`'s requests go: `_r` and the first 16 characters of
    /// that id, which are hexadecimal digits (a reply id that is not gets the hash of it instead).
    static func replySuffix(_ replyEndpoint: String) -> String {
        let prefix = replyEndpoint.prefix(16)
        guard prefix.count == 16, prefix.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) })
        else { return liveSuffix(for: replyEndpoint) + "r" }
        return "_r" + prefix
    }

    private static func hexadecimal(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }

    /// Adds one endpoint to those that need `name`, and listens on it now if the connection is up (else the next
    /// connection does, before it registers this process's endpoints again).
    private func wantLiveChannel(_ name: String) throws(WormholeError) {
        liveChannelsLock.lock()
        defer { liveChannelsLock.unlock() }
        liveChannels.wanted[name, default: 0] += 1
        guard let connection = liveChannels.connection, liveChannels.listening[name] == nil else { return }
        do throws(WormholeError) {
            liveChannels.listening[name] = try listen(on: liveChannels.groupChannel + name, connection)
        } catch {
            liveChannels.wanted[name, default: 1] -= 1
            if liveChannels.wanted[name] == 0 { liveChannels.wanted.removeValue(forKey: name) }
            throw error
        }
    }

    /// Removes one endpoint from those that need `name`; the last one stops listening on it.
    private func releaseLiveChannel(_ name: String) {
        liveChannelsLock.lock()
        defer { liveChannelsLock.unlock() }
        guard let count = liveChannels.wanted[name] else { return }
        guard count <= 1 else {
            liveChannels.wanted[name] = count - 1
            return
        }
        liveChannels.wanted.removeValue(forKey: name)
        // postgres-nio sends `UNLISTEN` itself when a channel's last listener stops.
        liveChannels.listening.removeValue(forKey: name)?.stop()
    }

    /// Listens on every live channel wanted, on a new listening connection (or none, when it ended), after the
    /// group's channel as that connection read it.
    private func listenOnLiveChannels(
        _ connection: PostgresConnection?,
        groupChannel: String = ""
    ) throws(WormholeError) {
        liveChannelsLock.lock()
        defer { liveChannelsLock.unlock() }
        for context in liveChannels.listening.values { context.stop() }
        liveChannels.listening = [:]
        liveChannels.connection = connection
        liveChannels.groupChannel = groupChannel
        guard let connection else { return }
        do throws(WormholeError) {
            for name in liveChannels.wanted.keys {
                liveChannels.listening[name] = try listen(on: groupChannel + name, connection)
            }
        } catch {
            // Until the next connection, registrations only add to what is wanted.
            for context in liveChannels.listening.values { context.stop() }
            liveChannels.listening = [:]
            liveChannels.connection = nil
            throw error
        }
    }

    /// `LISTEN` on `name`, whose notifications are routed as the group's are.
    private func listen(
        on name: String,
        _ connection: PostgresConnection
    ) throws(WormholeError) -> PostgresListenContext {
        // Only names made here reach this statement: the group's channel (`wormhole_` and hexadecimal digits) and
        // hexadecimal digits.
        guard name.utf8.allSatisfy({ $0 == 0x5f || ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x7a) }) else {
            throw WormholeError(
                .serverRejected,
                "The group's notification channel \(name) is not one this engine made."
            )
        }
        let context = connection.addListener(channel: name) { [weak self] _, notification in
            self?.route(notification.payload, sentBy: notification.backendPID)
        }
        // postgres-nio sends a `LISTEN` for the listener without saying when it took effect; this one, after it on
        // the same connection, returns only once both have, so that nothing sent after this returns is missed.
        do throws(WormholeError) {
            try connections.run(
                PostgresQuery(unsafeSQL: "LISTEN \"\(name)\""),
                on: connection,
                doing: "listening on \(name)"
            )
        } catch {
            context.stop()
            throw error
        }
        return context
    }

    /// The backend of the listening connection: the endpoint that replies reach.
    func listeningBackend() throws(WormholeError) -> Int32 {
        try startListening()
        guard let pid = state.withLock({ $0.backendPID }) else {
            throw WormholeError(
                .serverUnavailable,
                "The PostgreSQL server \(connections.server) is not reachable now."
            )
        }
        return pid
    }

    /// The endpoint ids of this process's hub: where replies to its requests go.
    let replyEndpoint = NotificationHub.randomID()

    /// Delivers a reply to this hub's requests.
    let replies = Locked<[String: @Sendable (LiveEnvelope) -> Void]>([:])

    // MARK: The listening thread

    /// Starts the listening thread if it is not running, and waits for its first `LISTEN`, for no more than 10 s.
    ///
    /// With `untilAnAttemptFails`, for an observer that the first connection will wake, the wait also ends once an
    /// attempt to connect failed (the server away): the caller's thread, often a task's, is not held while the engine
    /// tries again; so does a live endpoint, pending until a connection writes its row. Requests, which need the
    /// connection itself, wait for it.
    private func startListening(untilAnAttemptFails: Bool = false) throws(WormholeError) {
        let start = state.withLock { state -> Bool? in
            if state.closed { return nil }
            if state.started { return false }
            state.started = true
            return true
        }
        guard let start else {
            throw Connections.closedError
        }
        if start {
            let thread = Thread { [self] in run() }
            thread.name = "wormhole.postgres.listen"
            thread.start()
        }
        // Up to 10 s, or what is left of a live request's time-out (``Connections/callTimeLimit``).
        var patience = Duration.seconds(10)
        if let limit = Connections.callTimeLimit {
            patience = max(.zero, min(patience, limit.timeout - limit.start.duration(to: .now)))
        }
        _ = listening.wait(until: Date().addingTimeInterval(patience.secondsValue)) { [state] in
            state.withLock { $0.connections > 0 || $0.closed || (untilAnAttemptFails && $0.failedAttempts > 0) }
        }
    }

    private func run() {
        var backOff = Duration.milliseconds(50)
        while !state.withLock({ $0.closed }) {
            do {
                try listenOnce(resetBackOff: { backOff = .milliseconds(50) })
            } catch {
                logger.info("PostgreSQL engine: listening on \(connections.server) stopped: \(error)")
                state.withLock { $0.lastFailure = error }
            }
            state.withLock { state in
                state.failedAttempts += 1
                state.backendPID = nil
                state.aliveKey = nil
                state.connection = nil
                state.wake = nil
            }
            guard !state.withLock({ $0.closed }) else { break }
            // Registrations waiting for the first connection stop waiting: they are woken once it is made.
            listening.broadcast()
            Thread.sleep(forTimeInterval: backOff.secondsValue)
            backOff = min(backOff * 2, .seconds(2))
        }
        listening.broadcast()
    }

    /// Connects, listens, re-registers this process's endpoints, wakes every observer, then pings until the
    /// connection fails or the hub closes.
    private func listenOnce(resetBackOff: () -> Void) throws(WormholeError) {
        // The server's keep-alives find a client that vanished (a cut link) within seconds instead of hours, so that
        // its endpoints stop counting; this side finds a dead server by its pings, which time out.
        // `tcp_user_timeout` (15 s) also drops a client whose socket stopped taking data (a process stopped with
        // SIGSTOP, whose buffers are full): keep-alives alone are answered by its kernel.
        let dedicated = try connections.dedicatedConnection(parameters: [
            ("tcp_keepalives_idle", "5"), ("tcp_keepalives_interval", "2"), ("tcp_keepalives_count", "3"),
            ("tcp_user_timeout", "15000"),
        ])
        let connection = dedicated.connection
        // Cleanly: the hub closed while the connection still works. (Runs after the listeners' own ends below, whose
        // `UNLISTEN`s postgres-nio sends before the statements of this end.)
        defer { dedicated.end(state.withLock { $0.closed } && !connection.isClosed) }
        // Closed while the connection was being made: nothing to listen for.
        guard !state.withLock({ $0.closed }) else { return }
        let wake = DispatchSemaphore(value: 0)
        connection.closeFuture.whenComplete { _ in wake.signal() }
        // The group's channel and key as its row has them now (a rotation changes both), and a snapshot taken before
        // any `LISTEN`: what this connection hears comes from transactions that were not over at it.
        let (groupChannel, seal, replayGuard) = try readGroupKey(on: connection)
        state.withLock { state in
            state.seal = seal
            state.replayGuard = replayGuard
        }
        let groupListener = try listen(on: groupChannel, connection)
        defer { groupListener.stop() }
        let replies = try listen(on: groupChannel + Self.replySuffix(replyEndpoint), connection)
        defer { replies.stop() }
        try listenOnLiveChannels(connection, groupChannel: groupChannel)
        defer { try? listenOnLiveChannels(nil) }
        let pid = try decode(
            Int32.self,
            connections.run("SELECT pg_backend_pid()", on: connection, doing: "reading the backend").first,
            doing: "reading the backend"
        )
        // The lock that says this process lives, to whoever sends to its endpoints: a random key, held by this session
        // until it ends.
        let key = Int64.random(in: .min ... .max)
        try connections.run("SELECT pg_advisory_lock(\(key))", on: connection, doing: "taking the listening lock")
        // Released when the session ends, or, on a connection that goes back to its client, here (only this key: a
        // lock the app's own code holds on that session stays).
        defer {
            if case .client = connections.source, state.withLock({ $0.closed }), !connection.isClosed {
                _ = try? connections.run(
                    "SELECT pg_advisory_unlock(\(key))",
                    on: connection,
                    doing: "releasing the listening lock"
                )
            }
        }
        // Rows of processes whose listening connection ended (killed, cut off): gone, so `send` counts only the living.
        // (This session holds its own key, which its own shared try would get: its rows are left out by name.)
        try connections.run(
            """
            DELETE FROM wormhole.live_endpoints e WHERE e.grp = \(group)
                AND (e.alive_key IS NULL OR (e.alive_key <> \(key) AND pg_try_advisory_xact_lock_shared(e.alive_key)))
            """,
            on: connection,
            doing: "sweeping live endpoints of processes gone"
        )
        try writeEndpointRowsAgain(on: connection, pid: pid, key: key)
        let (first, unheard) = state.withLock { state in
            state.backendPID = pid
            state.aliveKey = key
            state.connection = connection
            state.wake = wake
            state.connections += 1
            state.lastFailure = nil
            defer { state.unheardObservers = [] }
            let unheard = state.unheardObservers.compactMap { state.observers[$0.name]?[$0.id] }
            return (state.connections == 1, unheard)
        }
        listening.broadcast()
        resetBackOff()
        if first {
            // Observers that stopped waiting for this connection, with the server away: what was posted since.
            for observer in unheard { observer.wake() }
        } else {
            logger.info("PostgreSQL engine: listening again on \(connections.server)")
            // Whatever was posted while no one listened: every observer reads again.
            wakeEveryObserver()
        }
        var lastPoll = ContinuousClock.now
        // A rotation that committed between the reading of the channel and the `LISTEN`s sent its hint to nobody
        // here: the channel is compared once more now, and then at every ping.
        guard try channelIsStill(groupChannel, on: connection) else { return }
        while !state.withLock({ $0.closed }) {
            if wake.wait(timeout: .now() + .seconds(2)) == .success {
                // The hub closed (the loop ends), the connection did, or a rotation hint came.
                if connection.isClosed { break }
                let hinted = state.withLock { state -> Bool in
                    defer { state.rotationHinted = false }
                    return state.rotationHinted
                }
                if hinted, try !channelIsStill(groupChannel, on: connection) { return }
                continue
            }
            if ContinuousClock.now - lastPoll >= safetyPollInterval {
                lastPoll = .now
                wakeEveryObserver()
            }
            // A ping, which compares the channel too: a connection that no longer answers is given up, and one whose
            // group has another channel now (a hint missed) listens anew.
            guard try channelIsStill(groupChannel, on: connection) else { return }
            removeUnremovedEndpoints()
        }
    }

    /// Whether the group's row still names `channel`; false when it names another, or this role no longer sees it
    /// (revoked): then the loop starts again, and reads the new channel and key, or fails as the role now must.
    private func channelIsStill(_ channel: String, on connection: PostgresConnection) throws(WormholeError) -> Bool {
        let rows = try connections.run(
            "SELECT channel FROM wormhole.groups WHERE grp = \(group)",
            on: connection,
            doing: "checking the listening connection"
        )
        let current = try rows.first.map { (row) throws(WormholeError) in
            try decode(String.self, row, doing: "checking the group's channel")
        }
        guard current == channel else {
            logger.info("PostgreSQL engine: the group's channel was rotated; listening again")
            return false
        }
        return true
    }

    /// Removes the rows of endpoints that stopped but whose removal failed (or whose registration failed after it
    /// may have been written); those that fail again are tried at the next tick.
    ///
    /// On a pooled connection and within 2 s: a removal that waits for a lock must neither take the listening
    /// connection down with it (a wait on it that times out closes it) nor hold up the loop's pings. No lock of the
    /// hub's is held: these ids left `endpoints` for good, and no registration writes them again.
    private func removeUnremovedEndpoints() {
        let ids = state.withLock { Array($0.unremovedEndpoints) }
        guard !ids.isEmpty else { return }
        let removed = Connections.$callTimeLimit.withValue((ContinuousClock.now, .seconds(2))) {
            () -> Result<Void, WormholeError> in
            do throws(WormholeError) {
                _ = try connections.query(
                    "DELETE FROM wormhole.live_endpoints WHERE grp = \(group) AND endpoint = ANY(\(ids)::text[])",
                    doing: "removing live endpoints that stopped"
                )
                return .success(())
            } catch {
                return .failure(error)
            }
        }
        do throws(WormholeError) {
            try removed.get()
            state.withLock {
                $0.unremovedEndpoints.subtract(ids)
                $0.failedRemovals = 0
            }
        } catch {
            // Said once, then every 5 minutes or so while it keeps failing (a privilege lost, a table locked).
            let failures = state.withLock { state -> Int in
                state.failedRemovals += 1
                return state.failedRemovals
            }
            if failures % 150 == 1 {
                logger.warning(
                    """
                    PostgreSQL engine: \(ids.count) stopped live endpoints could not be removed, tried again every \
                    2 s; senders count them meanwhile: \(error)
                    """
                )
            }
        }
    }

    /// Writes this process's endpoints again with the new connection's backend and key, while no registration or
    /// removal comes in between (a row removed meanwhile would otherwise come back, alive).
    private func writeEndpointRowsAgain(
        on connection: PostgresConnection,
        pid: Int32,
        key: Int64
    ) throws(WormholeError) {
        endpointRowsLock.lock()
        defer { endpointRowsLock.unlock() }
        let endpoints = state.withLock { Array($0.endpoints) }
        if !endpoints.isEmpty {
            try connections.run(
                """
                INSERT INTO wormhole.live_endpoints
                    (grp, endpoint, identifier, kind, backend_pid, backend_start, alive_key)
                SELECT \(group), e, i, k, \(pid), (SELECT backend_start FROM pg_stat_activity WHERE pid = \(pid)),
                    \(key)
                FROM unnest(\(endpoints.map(\.key))::text[], \(endpoints.map(\.value.identifier))::text[],
                    \(endpoints.map(\.value.kind))::text[]) AS t(e, i, k)
                ON CONFLICT (grp, endpoint) DO UPDATE
                SET backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start,
                    alive_key = EXCLUDED.alive_key
                """,
                on: connection,
                doing: "registering live endpoints again"
            )
        }
        // Said before the lock is let go: an endpoint registered from here on writes its own row (with this
        // connection's key); one registered before is among those just written.
        state.withLock { state in
            state.backendPID = pid
            state.aliveKey = key
        }
    }

    private func wakeEveryObserver() {
        let observers = state.withLock { $0.observers.values.flatMap(\.values) }
        for observer in observers { observer.wake() }
    }

    /// Routes one notification, on the event loop: wakes observers and hands live envelopes over. `sender` is the
    /// backend that sent it, as the server says.
    private func route(_ notification: String, sentBy sender: Int32) {
        guard let kind = notification.first else { return }
        if kind == "n" {
            let name = String(notification.dropFirst())
            let observers = state.withLock { $0.observers[name].map { Array($0.values) } ?? [] }
            for observer in observers { observer.wake() }
            return
        }
        if kind == "r" {
            hintRotation()
            return
        }
        // What carries data is taken only sealed, fresh and from the backend it names; anything else is a hint at
        // most. Every one heard goes through the replay guard, wanted here or not, so that it knows the last
        // transaction of each backend; the head is read from the notification as it came (the body starts it).
        let opened = kind == "Q" || kind == "L" ? unsealed(notification, sentBy: sender) : nil
        if kind == "Q" {
            // An append that carries its records: they go to the queue's takers, then its observers wake. Unsealed (a
            // forgery, a replay, an older build's), it only wakes them: they read the table.
            guard let queue = CarriedAppend.identifier(of: notification) else { return }
            let (takers, observers) = state.withLock { state in
                (
                    state.recordTakers[queue].map { Array($0.values) } ?? [],
                    state.observers["queue." + queue].map { Array($0.values) } ?? []
                )
            }
            if !takers.isEmpty {
                if let opened, let append = CarriedAppend(notification: String(opened)), append.identifier == queue {
                    let records = append.records
                    for taker in takers { taker(records) }
                } else {
                    refusedNotification()
                }
            }
            for observer in observers { observer.wake() }
            return
        }
        // Every process of the group hears every notification, its own included: what no endpoint here wants is
        // skipped after its head, without reading its body.
        guard let head = LiveEnvelope.peek(notification) else {
            logger.debug("PostgreSQL engine: an unreadable notification was ignored")
            return
        }
        let targets: [Endpoint] = state.withLock { state in
            switch head.kind {
            case .message:
                return state.endpoints.values.filter { $0.kind == "listen" && $0.identifier == head.identifier }
            case .request: return state.endpoints[head.target].map { [$0] } ?? []
            case .reply: return []
            }
        }
        if head.kind == .reply {
            guard head.target == replyEndpoint else { return }
        } else if targets.isEmpty {
            return
        }
        guard let opened else { return refusedNotification() }
        guard let envelope = LiveEnvelope(notification: String(opened)), envelope.kind == head.kind,
            envelope.identifier == head.identifier, envelope.target == head.target
        else {
            logger.debug("PostgreSQL engine: an unreadable notification was ignored")
            return
        }
        switch envelope.kind {
        case .message, .request:
            for endpoint in targets { endpoint.receive(envelope) }
        case .reply:
            if let waiter = replies.withLock({ $0[envelope.requestID] }) { waiter(envelope) }
        }
    }

    /// Counts a notification carrying data that was not taken, and says so once in a while.
    private func refusedNotification() {
        let count = refused.add(1, ordering: .relaxed).newValue
        if count == 1 || count % 1000 == 0 {
            logger.warning(
                """
                PostgreSQL engine: \(count) notifications carrying data were not taken: not sealed with the group's \
                key (forged, or from an older build), replayed, or sent by another backend than the one they name
                """
            )
        }
    }

    /// Stops listening; observers are no longer called. A connection of the engine's own is closed now; one borrowed
    /// from a client goes back to it from the listening thread, once its session is as it was lent.
    func close() {
        let (connection, wake) = state.withLock { state in
            state.closed = true
            return (state.connection, state.wake)
        }
        if case .location = connections.source { connection?.closeQuietly() }
        wake?.signal()
        listening.broadcast()
    }

    /// How many notifications carrying data were refused: not sealed, sealed with another key, replayed, or sent by
    /// another backend than the one they name; and queue records a notification carried that the acknowledgement
    /// found were not the table's.
    let refused = Atomic<Int>(0)

    /// The body of a sealed notification that this connection takes (``NotificationSeal``, ``ReplayGuard``); nil
    /// for any other.
    private func unsealed(_ notification: String, sentBy sender: Int32) -> Substring? {
        // The code is computed outside the hub's lock, which every registration and observer takes too.
        guard let seal = state.withLock({ $0.seal }), let opened = seal.open(notification) else { return nil }
        let admitted = state.withLock { state in
            state.replayGuard?.admit(opened.origin, code: opened.code, sentBy: sender) == true
        }
        return admitted ? opened.body : nil
    }

    /// Reads the group's channel and key, and a snapshot for the replay guard, on the listening connection.
    private func readGroupKey(
        on connection: PostgresConnection
    ) throws(WormholeError) -> (String, NotificationSeal, ReplayGuard) {
        let what = "reading the group's channel and key"
        let rows = try connections.run(
            """
            SELECT g.channel, g.key_inner, g.key_outer, pg_current_snapshot()::text
            FROM wormhole.groups g WHERE g.grp = \(group)
            """,
            on: connection,
            doing: what
        )
        guard let row = rows.first else {
            throw WormholeError(
                .serverRejected,
                "The group \(group) is not visible to this role (42501): it was never granted to it, or was revoked."
            )
        }
        let (channel, inner, outer, snapshot): (String, ByteBuffer, ByteBuffer, String)
        do { (channel, inner, outer, snapshot) = try row.decode((String, ByteBuffer, ByteBuffer, String).self) } catch {
            throw WormholeError(.serverRejected, "Unexpected columns while \(what): \(error).")
        }
        guard channel.hasPrefix("wormhole_"),
            let seal = NotificationSeal(inner: Array(inner.readableBytesView), outer: Array(outer.readableBytesView)),
            let replayGuard = ReplayGuard(snapshot: snapshot)
        else {
            throw RowValues.corrupt("a channel or key this package never writes", of: "groups", row: "group \(group)")
        }
        return (channel, seal, replayGuard)
    }

    /// A rotation hint (`r`, sent by a revocation on the old channel): the listening loop compares the group's
    /// channel at once (it does at every ping anyway), and when the row names another one now, listens anew, on the
    /// new channel with the new key, and wakes every observer, which reads again whatever came meanwhile. A forged
    /// hint costs one small query on the listening connection; hints that come while one waits count once.
    private func hintRotation() {
        let wake = state.withLock { state -> DispatchSemaphore? in
            guard !state.rotationHinted else { return nil }
            state.rotationHinted = true
            return state.wake
        }
        wake?.signal()
    }

    static func randomID() -> String {
        var generator = SystemRandomNumberGenerator()
        return String(generator.next(), radix: 16) + String(generator.next(), radix: 16)
    }
}

/// A condition to wait on for a state another thread changes.
final class Condition: Sendable {
    private let semaphore = DispatchSemaphore(value: 0)
    private let waiters = Atomic<Int>(0)

    /// Waits until `predicate` holds or `deadline` passes; returns whether it held.
    func wait(until deadline: Date, _ predicate: () -> Bool) -> Bool {
        while !predicate() {
            let remaining = deadline.timeIntervalSinceNow
            if remaining <= 0 { return false }
            waiters.add(1, ordering: .relaxed)
            _ = semaphore.wait(timeout: .now() + .milliseconds(Int(min(remaining, 0.05) * 1000) + 1))
            waiters.subtract(1, ordering: .relaxed)
        }
        return true
    }

    /// Wakes the waiters to check their predicates again.
    func broadcast() {
        for _ in 0..<waiters.load(ordering: .relaxed) { semaphore.signal() }
    }
}
