import Synchronization

/// A listener of a mailbox; it stops when cancelled, when its wormhole is told to stop listening to its
/// identifier, or when this handle is released.
///
/// Keep the handle as long as you want to listen:
///
/// ```swift
/// final class WidgetModel {
///     private var listener: MessageListener?
///     func start(_ wormhole: Wormhole) throws {
///         listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) { tap in
///             print("tapped", tap.number)
///         }
///     }
/// }
/// ```
public final class MessageListener: WormholeCancellable {
    /// The identifier listened to.
    public let identifier: String
    private let cancellation: Locked<(@Sendable () -> Void)?>
    private let sink: ListenerSink

    init(identifier: String, sink: ListenerSink, cancel: @escaping @Sendable () -> Void) {
        self.identifier = identifier
        self.sink = sink
        self.cancellation = Locked(cancel)
    }

    /// Stops the listener. A callback already scheduled is skipped; a callback under way finishes.
    public func cancel() {
        let cancel = cancellation.withLock { action in
            defer { action = nil }
            return action
        }
        cancel?()
    }

    /// Whether the listener has stopped: cancelled, or stopped by
    /// ``Wormhole/stopListeningForMessage(withIdentifier:)``.
    public var isCancelled: Bool { sink.isCancelled || cancellation.withLock { $0 == nil } }

    /// Runs `action` once when the listener stops, however it stops.
    @usableFromInline
    func whenCancelled(_ action: @escaping @Sendable () -> Void) { sink.whenCancelled(action) }

    deinit { cancel() }
}
