import Dispatch
import Foundation

/// How a wormhole made with ``Wormhole/init(session:transitingType:coder:)`` carries its messages:
/// MMWormhole's `MMWormholeTransitingTypeSessionContext`, `…SessionMessage` and `…SessionFile`.
public enum SessionTransitingType: String, Sendable, Hashable, CaseIterable {
    /// Each identifier is a key of the session's application context: the newest message of each identifier
    /// reaches the counterpart when it next activates, and only the identifiers whose values changed fire.
    /// Messages must be JSON (the default coder).
    case sessionContext
    /// Each message is a session message: only while the counterpart is reachable; passing throws
    /// ``WormholeError/Code/notReachable`` otherwise (``WormholeError/Code/counterpartUnknown`` when it never
    /// activated).
    case sessionMessage
    /// Each message is written to a file and sent as a session file transfer: queued, delivered once, in order.
    case sessionFile
}

extension Wormhole {
    /// Creates a wormhole whose mailboxes ride a session, as MMWormhole's `MMWormholeSession` with a transiting
    /// type: ``passMessageObject(_:identifier:)`` sends to the session's counterpart, and
    /// ``listenForMessage(withIdentifier:as:deliveringCurrentMessage:on:errorHandler:listener:)`` hears the
    /// counterpart's messages.
    ///
    /// ```swift
    /// let session = try WormholeSession(wormhole: wormhole, name: "phone", counterpart: "watch")
    /// let phone = Wormhole(session: session, transitingType: .sessionContext)
    /// let listener = try phone.listenForMessage(withIdentifier: "steps", as: Int.self) { print($0) }
    /// try session.activate()                                  // after the listeners, as MMWormhole asks
    /// try phone.passMessageObject(4200, identifier: "steps")  // errors are thrown, never dropped
    /// ```
    ///
    /// Unlike MMWormhole's session transitings, every failure is thrown or reported (``WormholeError/Code/notActivated``,
    /// ``WormholeError/Code/notReachable``…), reading a message after a wake-up returns it, only the identifiers
    /// that changed fire, and what the counterpart sent while this side was inactive arrives at activation (context
    /// and files; a message needs both sides there). A session wormhole has mailboxes only: the other modes throw
    /// ``WormholeError/Code/unsupported``; use the session's wormhole for them.
    public convenience init(
        session: WormholeSession,
        transitingType: SessionTransitingType,
        coder: any MessageCoder = JSONMessageCoder()
    ) {
        let transiting = SessionTransiting(session: session, type: transitingType)
        self.init(
            transiting: transiting,
            notifier: transiting,
            coder: coder,
            sender: session.wormhole.sender,
            logger: session.logger
        )
    }
}

/// The mailboxes of a session wormhole: what the counterpart sent, newest per identifier, in memory; and the
/// notifier that wakes this process's listeners when something arrives.
final class SessionTransiting: Transiting, Notifier {
    let session: WormholeSession
    let type: SessionTransitingType
    private let received = Locked<[String: Envelope]>([:])
    private let observers = Locked<[String: [UInt64: @Sendable () -> Void]]>([:])
    private let nextID = Locked<UInt64>(0)
    private let generation = UInt64.random(in: 1...UInt64.max)
    /// The sequence of the last message received: it only grows, so that a listener never takes a message sent
    /// after a clear for one it has seen.
    private let lastSequence = Locked<UInt64>(0)
    private let listener = Locked<SessionListener?>(nil)
    /// What was cleared since it was received: not read back from the received context.
    private let cleared = Locked<(all: Bool, identifiers: Set<String>)>((false, []))

    static let identifierKey = "wormhole.identifier"
    static let payloadKey = "wormhole.payload"

    init(session: WormholeSession, type: SessionTransitingType) {
        self.session = session
        self.type = type
        let handle: SessionListener
        switch type {
        case .sessionContext:
            handle = session.onApplicationContext(on: .notifierThread) { [weak self] update in
                guard let self else { return }
                for key in update.changedKeys.sorted() {
                    do throws(WormholeError) {
                        let payload = try update.context[key].map { value throws(WormholeError) in
                            try WormholeSession.encode(value)
                        }
                        store(payload, identifier: key, sender: update.sender)
                    } catch {
                        session.report(error)
                    }
                }
            }
        case .sessionMessage:
            handle = session.onMessage(on: .notifierThread) { [weak self] message in
                guard let self else { return }
                // Another's message (the session's own sendMessage): left to the session's other handlers.
                guard case .string(let identifier)? = message.message[Self.identifierKey],
                    case .string(let encoded)? = message.message[Self.payloadKey],
                    let payload = Data(base64Encoded: encoded)
                else { return }
                store(payload, identifier: identifier, sender: message.sender)
            }
        case .sessionFile:
            handle = session.onFile(on: .notifierThread) { [weak self] file in
                guard let self, let identifier = file.transfer.metadata[Self.identifierKey] else { return }
                do {
                    let payload = try Data(contentsOf: URL(fileURLWithPath: file.path))
                    try? FileManager.default.removeItem(atPath: file.path)
                    store(payload, identifier: identifier, sender: file.transfer.sender)
                } catch {
                    session.report(
                        WormholeError(
                            .ioFailure,
                            "The session file \(file.path) could not be read: \(error).",
                            identifier: identifier,
                            underlyingError: error
                        )
                    )
                }
            }
        }
        listener.withLock { $0 = handle }
    }

    /// Keeps what arrived as the identifier's newest message and wakes its observers.
    private func store(_ payload: Data?, identifier: String, sender: String) {
        guard MessageIdentifier.isValid(identifier) else {
            session.report(
                WormholeError(.invalidIdentifier, "The counterpart sent an invalid identifier; it is passed over.")
            )
            return
        }
        cleared.withLock { _ = $0.identifiers.remove(identifier) }
        received.withLock { received in
            guard let payload else {
                received[identifier] = nil
                return
            }
            let sequence = lastSequence.withLock { (last) -> UInt64 in
                last += 1
                return last
            }
            received[identifier] = Envelope(
                sequence: sequence,
                generation: generation,
                sender: sender,
                timestampNanoseconds: ProcessFacts.wallClockNanoseconds(),
                payload: payload
            )
        }
        let name = Wormhole.notificationName(forIdentifier: identifier)
        for handler in observers.withLock({ ($0[name] ?? [:]).sorted { $0.key < $1.key }.map(\.value) }) {
            handler()
        }
    }

    // MARK: Transiting

    func writeMessage(_ payload: Data, sender: String, identifier: String) throws(WormholeError) -> Envelope {
        try MessageIdentifier.validate(identifier)
        switch type {
        case .sessionContext:
            let value: JSONValue
            do {
                value = try WormholeSession.coder.decode(JSONValue.self, from: payload)
            } catch {
                throw WormholeError(
                    .encodingFailed,
                    "A session context carries JSON; this wormhole's coder wrote something else. Use the default "
                        + "JSONMessageCoder, or the message or file transiting type.",
                    identifier: identifier,
                    underlyingError: error
                )
            }
            try session.mergeApplicationContext([identifier: value])
        case .sessionMessage:
            _ = try session.sendMessageWaiting(
                [Self.identifierKey: .string(identifier), Self.payloadKey: .string(payload.base64EncodedString())],
                expectsReply: false,
                timeout: .seconds(10)
            )
        case .sessionFile:
            let file = URL(fileURLWithPath: NSTemporaryDirectory())
                .appendingPathComponent("wormhole-session-\(UUID().uuidString.lowercased())")
            do {
                try payload.write(to: file, options: .atomic)
            } catch {
                throw WormholeError(
                    .ioFailure,
                    "The message could not be written to \(file.path) to be sent: \(error).",
                    identifier: identifier,
                    underlyingError: error
                )
            }
            defer { try? FileManager.default.removeItem(at: file) }
            try session.transferFile(file.path, name: identifier, metadata: [Self.identifierKey: identifier])
        }
        return Envelope(
            sequence: 0,
            generation: generation,
            sender: sender,
            timestampNanoseconds: ProcessFacts.wallClockNanoseconds(),
            payload: payload
        )
    }

    func readMessage(identifier: String) throws(WormholeError) -> Envelope? {
        try MessageIdentifier.validate(identifier)
        if let envelope = received.withLock({ $0[identifier] }) { return envelope }
        // After a relaunch, the context received before is still the newest: MMWormhole read it there too.
        guard type == .sessionContext, !cleared.withLock({ $0.all || $0.identifiers.contains(identifier) }),
            let value = try session.receivedApplicationContext[identifier]
        else { return nil }
        return Envelope(
            sequence: 0,
            generation: generation,
            sender: session.counterpart,
            timestampNanoseconds: 0,
            payload: try WormholeSession.encode(value)
        )
    }

    func deleteMessage(identifier: String) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        _ = received.withLock { $0.removeValue(forKey: identifier) }
        cleared.withLock { _ = $0.identifiers.insert(identifier) }
    }

    /// Clears what this side received; what was sent stays in the counterpart's hands.
    func deleteAllMessages() throws(WormholeError) {
        received.withLock { $0 = [:] }
        cleared.withLock { $0 = (true, []) }
    }

    func identifiers() throws(WormholeError) -> [String] {
        var identifiers = Set(received.withLock { $0.keys })
        if type == .sessionContext, !cleared.withLock({ $0.all }) {
            let gone = cleared.withLock { $0.identifiers }
            identifiers.formUnion(try session.receivedApplicationContext.keys.filter { !gone.contains($0) })
        }
        return identifiers.sorted()
    }

    // MARK: Notifier

    /// Nothing to do: a session wormhole's messages go to the counterpart, whose session wakes its listeners.
    func post(_ name: String) throws(WormholeError) {}

    func observe(_ name: String, handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        let id = nextID.withLock { (next) -> UInt64 in
            next += 1
            return next
        }
        observers.withLock { $0[name, default: [:]][id] = handler }
        return NotifierObservation { [weak self] in
            self?.observers.withLock { observers in
                observers[name]?[id] = nil
                if observers[name]?.isEmpty == true { observers[name] = nil }
            }
        }
    }
}
