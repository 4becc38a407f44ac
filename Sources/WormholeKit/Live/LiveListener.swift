import Foundation
import Synchronization

/// A process listening for live messages or answering requests; it stops when cancelled or released.
public final class LiveListener: WormholeCancellable {
    /// The identifier listened to.
    public let identifier: String
    private let observation = Locked<NotifierObservation?>(nil)
    /// Set when listening stops; callbacks check it, holding it strongly rather than the handle weakly.
    let cancelled = Flag()

    init(identifier: String) { self.identifier = identifier }

    func attach(_ observation: NotifierObservation) {
        self.observation.withLock { $0 = observation }
        if isCancelled { cancel() }
    }

    /// Stops listening: senders no longer reach this process. A message being handled finishes.
    public func cancel() {
        cancelled.set()
        let observation = self.observation.withLock { observation in
            defer { observation = nil }
            return observation
        }
        observation?.cancel()
    }

    /// Whether listening has stopped.
    public var isCancelled: Bool { cancelled.isSet }

    deinit { cancel() }
}
