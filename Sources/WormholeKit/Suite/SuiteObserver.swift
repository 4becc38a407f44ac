import Foundation
import Logging
import Synchronization

/// A suite observer; it stops when cancelled or released.
public final class SuiteObserver: WormholeCancellable {
    /// The suite observed.
    public let name: String
    private let observation = Locked<NotifierObservation?>(nil)
    private let cancelled = Atomic<Bool>(false)

    init(name: String) { self.name = name }

    func attach(_ observation: NotifierObservation) {
        self.observation.withLock { $0 = observation }
        if isCancelled { cancel() }
    }

    /// Stops observing: changes scheduled but not started are skipped. A change being handed over finishes, and so
    /// may one another thread was starting at that very moment (see ``WormholeCancellable/cancel()``).
    public func cancel() {
        cancelled.store(true, ordering: .releasing)
        let observation = self.observation.withLock { observation in
            defer { observation = nil }
            return observation
        }
        observation?.cancel()
    }

    /// Whether the observer has stopped.
    public var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    deinit { cancel() }
}
