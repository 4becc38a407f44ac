import Dispatch
import Foundation
import Logging

/// A session between this process and one named counterpart: WatchConnectivity's `WCSession`, and MMWormhole's
/// `MMWormholeSession`, between two processes on one host (a directory engine) or on two hosts (the PostgreSQL
/// engine).
///
/// ```swift
/// let session = try WormholeSession(wormhole: wormhole, name: "phone", counterpart: "watch")
/// let contexts = session.onApplicationContext { update in print(update.changedKeys) }   // before activate()
/// try session.activate()
/// try session.updateApplicationContext(["face": "modular"])   // the watch gets it when it next activates
/// let reply = try await session.sendMessage(["ping": 1])      // only while the watch is reachable
/// try session.transferUserInfo(["steps": 4200])              // queued; in order and once
/// try session.transferFile("/tmp/track.gpx", metadata: ["kind": "track"])
/// ```
///
/// Four ways to reach the counterpart, as WatchConnectivity has them:
///
/// - **Application context** (``updateApplicationContext(_:)``): the latest state, replacing the one before. The
///   counterpart receives it when it next activates, even if this process has exited; only the newest reaches it,
///   and its handlers hear which keys changed since the context it received before.
/// - **Messages** (``sendMessage(_:expectsReply:timeout:)``): live, only while the counterpart is activated; exactly one of a
///   reply or an error.
/// - **User info** (``transferUserInfo(_:)``): queued, delivered in order and once, across restarts of either side;
///   outstanding transfers can be listed and cancelled.
/// - **Files** (``transferFile(_:name:metadata:progress:)``): queued, streamed, delivered once, with metadata.
///
/// Register handlers (``onApplicationContext(keys:on:handler:)``, ``onMessage(on:handler:)``,
/// ``onUserInfo(on:handler:)``, ``onFile(on:handler:)``, or their `AsyncSequence` forms) before ``activate()``, as
/// WatchConnectivity asks of its delegate: a user info transfer or a file is taken from its queue only while a
/// handler is there to get it, so none is lost. Each side of a pair names itself and its counterpart, and the names
/// must mirror each other (`phone`→`watch` on one side, `watch`→`phone` on the other). One process should hold a
/// name's session at a time.
///
/// A session is `Sendable`: use it from any thread or task.
public final class WormholeSession: Sendable {
    /// This side's name.
    public let name: String
    /// The counterpart's name.
    public let counterpart: String
    /// The wormhole the session rides; its engine keeps everything the session stores.
    public let wormhole: Wormhole
    /// Where files received from the counterpart are put.
    public let receivedFilesDirectory: String

    let outgoing: SessionChannels
    let incoming: SessionChannels
    let logger: Logger

    let contextHandlers = SessionHandlers<SessionContextUpdate>(label: "context")
    let messageHandlers = SessionHandlers<SessionMessage>(label: "message")
    let userInfoHandlers = SessionHandlers<SessionUserInfoTransfer>(label: "userinfo")
    let fileHandlers = SessionHandlers<ReceivedFile>(label: "file")
    let userInfoFinishedHandlers = SessionHandlers<SessionUserInfoTransfer>(label: "userinfo.finished")
    let fileFinishedHandlers = SessionHandlers<FileTransfer>(label: "file.finished")
    let activationHandlers = SessionHandlers<SessionActivationState>(label: "activation")
    let reachabilityHandlers = SessionHandlers<Bool>(label: "reachability")
    let errorHandlers = SessionHandlers<WormholeError>(label: "error")

    /// What the session runs while activated, and its state; one lock, never held across a call to a handler.
    let running = Locked(Running())
    /// Serialises what the session receives: contexts and messages, in order.
    let receiving: DispatchQueue
    /// Serialises reachability: the probes (which may wait for a server) and the changes handed to the handlers.
    let reachabilityQueue: DispatchQueue
    /// Held while a consumer is made, so that two are never made for one kind.
    let consumerCreation = Locked(())
    /// Held while a context is read, changed and written by ``mergeApplicationContext(_:)``.
    let merging = Locked(())
    /// The transfers being handed over in this process, by channel and id: a session made again under the same name
    /// (an app that makes its session anew) must not hand over what the one before it is still handing over.
    static let deliveriesUnderWay = Locked<Set<String>>([])

    /// Runs `body` as the only delivery of `id` on `channel` in this process; returns nil, running nothing, when
    /// another is under way (the transfer waits, and the consumers are woken again in a second).
    func exclusively<Result>(
        _ channel: String,
        _ id: String,
        _ body: () throws(WormholeError) -> Result
    ) throws(WormholeError) -> Result? {
        let key = channel + "/" + id
        guard Self.deliveriesUnderWay.withLock({ $0.insert(key).inserted }) else {
            retryConsumersLater()
            return nil
        }
        defer { _ = Self.deliveriesUnderWay.withLock { $0.remove(key) } }
        return try body()
    }

    struct Running {
        var state: SessionActivationState = .notActivated
        /// Between `activate()`'s call and its return: the state is still `notActivated`, so that nothing is sent
        /// before everything is set up, and a second `activate()` does nothing.
        var starting = false
        var isReachable = false
        var listeners: [any WormholeCancellable] = []
        /// Made at the first activation with a handler of their kind, and kept until the session goes: stopping one
        /// would wait for a delivery that may wait for the caller's queue, and a second one could deliver what the
        /// first one is still handling. While the session is deactivated, or has no handler of their kind, they
        /// leave each transfer unacknowledged (user info puts it off with `QueueOutcome.later`, files throw
        /// ``NoHandlerLeft``), and are woken again at the next activation or handler.
        var userInfoConsumer: QueueConsumer?
        var fileReceiver: QueueConsumer?
        var timer: (any DispatchSourceTimer)?
        /// The ids of the transfers received whose handlers have run, in case the write that records it fails: the
        /// transfer comes again, and only that write is tried again.
        var handledUserInfo: Set<String> = []
        var handledFiles: Set<String> = []
        /// The transfers this side sent and not yet known as delivered, by id: what "finished" handlers are told.
        var sentUserInfo: [String: SessionUserInfoTransfer] = [:]
        var sentFiles: [String: FileTransfer] = [:]
    }

    /// How often an activated session checks that its counterpart is still reachable, besides the checks that its
    /// counterpart's activation and deactivation trigger: a counterpart killed says nothing.
    public static let reachabilityCheckInterval: Duration = .seconds(2)

    /// Creates a session from this process, `name`, to `counterpart`, over `wormhole`.
    ///
    /// - Parameters:
    ///   - wormhole: The wormhole; on a directory for two processes of one host, on the PostgreSQL engine for two
    ///     hosts.
    ///   - name: This side's name: 1 to 64 letters, digits, `-` or `_`.
    ///   - counterpart: The counterpart's name, by the same rules.
    ///   - receivedFilesDirectory: Where received files go (created with mode 0700); by default a directory named
    ///     after the session in the system's temporary directory.
    /// - Throws: ``WormholeError/Code/invalidIdentifier`` for a bad name, or a name equal to the counterpart's.
    public init(
        wormhole: Wormhole,
        name: String,
        counterpart: String,
        receivedFilesDirectory: String? = nil
    ) throws(WormholeError) {
        try Self.validate(name: name, role: "name")
        try Self.validate(name: counterpart, role: "counterpart")
        guard name != counterpart else {
            throw WormholeError(
                .invalidIdentifier,
                "A session's name and its counterpart's must differ; both are \"\(name)\"."
            )
        }
        self.wormhole = wormhole
        self.name = name
        self.counterpart = counterpart
        self.receivedFilesDirectory =
            receivedFilesDirectory
            ?? URL(fileURLWithPath: NSTemporaryDirectory())
            .appendingPathComponent("wormhole-session-\(name)-from-\(counterpart)-\(getuid())").path
        self.outgoing = SessionChannels(from: name, to: counterpart)
        self.incoming = SessionChannels(from: counterpart, to: name)
        self.logger = wormhole.logger
        self.receiving = DispatchQueue(label: "wormhole.session.\(name).receiving")
        self.reachabilityQueue = DispatchQueue(label: "wormhole.session.\(name).reachability")
    }

    static func validate(name: String, role: String) throws(WormholeError) {
        let allowed = name.utf8.allSatisfy { byte in
            (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
                || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
                || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
        }
        guard !name.isEmpty, name.utf8.count <= 64, allowed else {
            throw WormholeError(
                .invalidIdentifier,
                "The session's \(role) \(name.debugDescription) is not 1 to 64 letters, digits, '-' or '_'."
            )
        }
    }

    // MARK: Activation

    /// The session's activation state.
    public var activationState: SessionActivationState { running.withLock { $0.state } }

    /// Whether the counterpart is activated and answering now, as this side last found out (at activation, when
    /// the counterpart activates or deactivates, after each message, and every ``reachabilityCheckInterval``).
    public var isReachable: Bool { running.withLock { $0.isReachable } }

    /// Starts the session: receives what the counterpart sent while this side was away (the newest application
    /// context at once, then queued user info and files, for the handlers registered), answers messages, and tells
    /// the counterpart it is reachable. Activating an activated session does nothing.
    ///
    /// - Throws: the engine's errors (``WormholeError/Code/serverUnavailable``,
    ///   ``WormholeError/Code/directoryUnavailable``…); the session stays not activated then.
    public func activate() throws(WormholeError) {
        let starting = running.withLock { (running) -> Bool in
            guard running.state == .notActivated, !running.starting else { return false }
            running.starting = true
            return true
        }
        guard starting else { return }
        do throws(WormholeError) {
            try start()
        } catch {
            running.withLock { $0.starting = false }
            stop(finalState: .notActivated, announce: false)
            throw error
        }
        // A deactivate() that came in between has told its handlers already.
        if activationState == .activated { activationHandlers.deliver(.activated) }
    }

    /// Stops the session: it takes nothing more, stops answering messages, and tells the counterpart it is not
    /// reachable. What the counterpart sends meanwhile (context, user info, files) waits for the next activation.
    ///
    /// It does not wait for a handler under way, which finishes (and its transfer is acknowledged): so it may be
    /// called from a handler, or from the queue a handler runs on.
    public func deactivate() {
        let stopping = running.withLock { (running) -> Bool in
            guard running.state == .activated else { return false }
            running.state = .inactive
            return true
        }
        guard stopping else { return }
        activationHandlers.deliver(.inactive)
        stop(finalState: .notActivated, announce: true)
        activationHandlers.deliver(.notActivated)
    }

    deinit {
        let listeners = running.withLock { (running) -> [any WormholeCancellable] in
            running.timer?.cancel()
            return running.listeners + [running.userInfoConsumer, running.fileReceiver].compactMap { $0 }
        }
        // Nothing is under way: a consumer's delivery holds the session.
        for listener in listeners { listener.cancel() }
    }

    private func start() throws(WormholeError) {
        // Endpoints first, so that the counterpart finds this side reachable once it reads the presence below.
        let probe = try wormhole.listenForLiveMessageData(withIdentifier: incoming.probe, on: .notifierThread) { _ in }
        let responder = try respondToMessages()
        let presence = try wormhole.listenForEnvelopes(withIdentifier: incoming.presence, on: .notifierThread) {
            [weak self] _ in self?.checkReachability()
        }
        let contexts = try wormhole.listenForEnvelopes(
            withIdentifier: incoming.context,
            on: .queue(receiving),
            errorHandler: { [weak self] error in self?.report(error) }
        ) { [weak self] _ in self?.receiveContext() }
        let outboxes = try observeOutboxes()
        try announce(.activated)
        do throws(WormholeError) {
            try startAnnounced(listeners: [probe, responder, presence, contexts] + outboxes)
        } catch {
            // The counterpart was told this side is activated: it is told otherwise before the failure is thrown.
            do throws(WormholeError) { try announce(.notActivated) } catch let announcing { report(announcing) }
            throw error
        }
    }

    /// The rest of ``start()``, once the counterpart was told this side is activated.
    private func startAnnounced(listeners: [any WormholeCancellable]) throws(WormholeError) {
        let timer = DispatchSource.makeTimerSource(queue: reachabilityQueue)
        let interval = Self.reachabilityCheckInterval.components
        let milliseconds = Int(interval.seconds * 1000 + interval.attoseconds / 1_000_000_000_000_000)
        timer.schedule(deadline: .now(), repeating: .milliseconds(milliseconds))
        timer.setEventHandler { [weak self] in self?.checkReachabilityNow() }
        // Activated in one step with what stop() undoes, so that a deactivate() finds all of it.
        running.withLock { running in
            running.listeners = listeners
            running.timer = timer
            running.starting = false
            running.state = .activated
        }
        timer.resume()
        try startConsumers()
        receiveCurrentContext()
    }

    private func stop(finalState: SessionActivationState, announce: Bool) {
        let (listeners, timer) = running.withLock {
            (running) -> ([any WormholeCancellable], (any DispatchSourceTimer)?) in
            defer {
                running.listeners = []
                running.timer = nil
            }
            return (running.listeners, running.timer)
        }
        timer?.cancel()
        // None of these waits for a handler: the consumers, which would, are kept (see `Running`).
        for listener in listeners { listener.cancel() }
        if announce {
            do throws(WormholeError) {
                try self.announce(.notActivated)
            } catch {
                report(error)
            }
        }
        let wasReachable = running.withLock { (running) -> Bool in
            running.state = finalState
            defer { running.isReachable = false }
            return running.isReachable
        }
        if wasReachable { reachabilityQueue.async { [reachabilityHandlers] in reachabilityHandlers.deliver(false) } }
    }

    /// Writes this side's presence, which wakes the counterpart's reachability check.
    private func announce(_ state: SessionActivationState) throws(WormholeError) {
        let presence = SessionPresence(
            state: state,
            sender: wormhole.sender,
            nanoseconds: ProcessFacts.wallClockNanoseconds()
        )
        _ = try wormhole.passMessageData(try Self.encode(presence), identifier: outgoing.presence)
    }

    /// Makes the consumers of user info and files that have handlers, if the session is activated, and wakes
    /// those made already: what waited for an activation or a handler is taken now.
    func startConsumers() throws(WormholeError) {
        try consumerCreation.withLock { (_) throws(WormholeError) in
            let (activated, userInfo, files) = running.withLock {
                ($0.state == .activated, $0.userInfoConsumer, $0.fileReceiver)
            }
            guard activated else { return }
            if let userInfo {
                userInfo.wakeUp()
            } else if !userInfoHandlers.isEmpty {
                let consumer = try consumeUserInfo()
                running.withLock { $0.userInfoConsumer = consumer }
            }
            if let files {
                files.wakeUp()
            } else if !fileHandlers.isEmpty {
                let receiver = try receiveFiles()
                running.withLock { $0.fileReceiver = receiver }
            }
        }
    }

    /// Wakes the consumers again after a while: a transfer left unacknowledged because a write failed is tried
    /// again even when nothing new comes.
    func retryConsumersLater() {
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(1)) { [weak self] in
            guard let self else { return }
            let consumers = running.withLock { [$0.userInfoConsumer, $0.fileReceiver].compactMap { $0 } }
            for consumer in consumers { consumer.wakeUp() }
        }
    }

    func requireActivated(_ action: String) throws(WormholeError) {
        let state = activationState
        guard state == .activated else {
            throw WormholeError(
                .notActivated,
                "The session \(name)→\(counterpart) is \(state), so it cannot \(action); call activate() first."
            )
        }
    }

    // MARK: Reachability

    /// Checks whether the counterpart is reachable, on the reachability queue.
    func checkReachability() {
        reachabilityQueue.async { [weak self] in self?.checkReachabilityNow() }
    }

    private func checkReachabilityNow() {
        guard activationState == .activated else { return }
        let reachable: Bool
        do throws(WormholeError) {
            reachable = try wormhole.sendMessageData(Data(), identifier: outgoing.probe) > 0
        } catch  where error.code == .notReachable {
            reachable = false
        } catch {
            report(error)
            reachable = false
        }
        updateReachable(reachable)
    }

    /// Records what a message's outcome says of reachability; the handlers hear it in order, from the reachability
    /// queue.
    func setReachable(_ reachable: Bool) {
        reachabilityQueue.async { [weak self] in self?.updateReachable(reachable) }
    }

    /// On the reachability queue: changes are decided and handed over in one order.
    private func updateReachable(_ reachable: Bool) {
        let changed = running.withLock { (running) -> Bool in
            guard running.state == .activated, running.isReachable != reachable else { return false }
            running.isReachable = reachable
            return true
        }
        if changed { reachabilityHandlers.deliver(reachable) }
    }

    /// Whether the counterpart ever activated a session with this side.
    func counterpartIsKnown() throws(WormholeError) -> Bool {
        try wormhole.envelope(withIdentifier: incoming.presence) != nil
    }

    // MARK: Errors and encoding

    /// Hands an error to the error handlers, or logs it: a session never drops one.
    func report(_ error: WormholeError) {
        if !errorHandlers.isEmpty {
            errorHandlers.deliver(error)
        } else {
            logger.error("session \(name)→\(counterpart): \(error)")
        }
    }

    static let coder = JSONMessageCoder()

    static func encode(_ value: some Encodable) throws(WormholeError) -> Data {
        do {
            return try coder.encode(value)
        } catch {
            throw WormholeError(.encodingFailed, "The session could not encode \(error).", underlyingError: error)
        }
    }

    static func decode<Value: Decodable>(
        _ type: Value.Type,
        from data: Data,
        identifier: String
    ) throws(WormholeError) -> Value {
        do {
            return try coder.decode(type, from: data)
        } catch {
            throw WormholeError(
                .decodingFailed,
                "The session's record is not a \(Value.self) this build reads: \(error).",
                identifier: identifier,
                underlyingError: error
            )
        }
    }
}

/// The identifiers a session uses for one direction, `from` to `to` (FORMAT.md, "Sessions").
struct SessionChannels: Sendable {
    let prefix: String
    init(from: String, to: String) { prefix = "session.\(from).\(to)" }

    /// The sender's presence: a mailbox of ``SessionPresence``.
    var presence: String { prefix + ".presence" }
    /// What the receiver listens on while activated, so that the sender can check it is reachable.
    var probe: String { prefix + ".probe" }
    /// The application context: a mailbox of ``SessionContextRecord``.
    var context: String { prefix + ".context" }
    /// The last context the receiver handed over: a mailbox of ``SessionReceivedContext``.
    var receivedContext: String { prefix + ".context-received" }
    /// Live messages, as requests.
    var message: String { prefix + ".message" }
    /// The queue of user info transfers.
    var userInfo: String { prefix + ".userinfo" }
    /// The sender's outbox of user info transfers: a suite of ``SessionOutboxEntry`` by id.
    var userInfoOutbox: String { prefix + ".userinfo-outbox" }
    /// The file transfers' channel.
    var files: String { prefix + ".files" }
    /// The sender's outbox of file transfers: a suite of ``FileTransfer`` by id.
    var filesOutbox: String { prefix + ".files-outbox" }
}
