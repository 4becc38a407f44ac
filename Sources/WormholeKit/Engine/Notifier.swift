import Synchronization

/// Tells other processes, and other wormholes in this process, that something changed: Darwin notifications'
/// `post` and `observe`, by name, with no payload.
///
/// The wormhole stores a message through its ``Transiting`` and then posts the mailbox's notification name; a
/// listener observes the name and reads the mailbox when it fires. So a notifier needs to carry no data, and may
/// coalesce: after a post, every observer of the name is called at least once, later than the post began. (On a
/// ``DirectoryEngine`` on Linux the mailbox file's own write wakes its listeners, and a pass posts nothing; see
/// ``DirectoryNotifier``.)
///
/// ``DirectoryNotifier`` is the default (inotify on Linux, with polling as the fallback; Darwin notifications on Apple
/// platforms); `DarwinNotifier`, which exists on Apple platforms only, posts names under a prefix of your choice;
/// `WormholeTesting` ships a `ManualNotifier` for tests. Every implementation must pass this test:
///
/// ```swift
/// let (calls, call) = AsyncStream.makeStream(of: Void.self)
/// let observation = try notifier.observe("mailbox.button") { call.yield() }
/// try notifier.post("mailbox.button")
/// for await _ in calls { break }   // the handler ran, soon after the post
/// observation.cancel()             // and it runs no more once this returns
/// ```
public protocol Notifier: Sendable {
    /// Wakes the observers of `name` in every process.
    ///
    /// - Throws: ``WormholeError`` when the notification could not be sent.
    func post(_ name: String) throws(WormholeError)

    /// Calls `handler` after each post of `name`, until the returned observation is cancelled or released.
    ///
    /// The handler runs on a thread of the notifier's choosing (for ``DirectoryNotifier``, its monitor thread)
    /// and must return quickly. Calls for one observation never overlap.
    func observe(_ name: String, handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation
}

/// An active observation of a notification name; it ends when cancelled or released.
public final class NotifierObservation: Sendable {
    private let cancellation: Locked<(@Sendable () -> Void)?>

    /// Creates an observation that runs `cancel` once, when cancelled or released.
    public init(cancel: @escaping @Sendable () -> Void) {
        cancellation = Locked(cancel)
    }

    /// Stops the observation; the handler is not called after this returns (unless a call is under way).
    public func cancel() {
        let cancel = cancellation.withLock { action in
            defer { action = nil }
            return action
        }
        cancel?()
    }

    deinit { cancel() }
}

/// A notifier with work to do before a name is observed that must not run under its caller's locks (making a file,
/// which flushes it to the disk); ``ListenerRegistry`` calls it first.
protocol PreparesObservation {
    /// Prepares the observation of `name`; what fails is reported by the observation itself.
    func prepareToObserve(_ name: String)
}
