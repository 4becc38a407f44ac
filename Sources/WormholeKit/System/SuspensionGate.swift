import Dispatch
import Synchronization

/// Whether this process may take file locks in its wormholes' directories now, and how many calls hold one.
///
/// iOS ends an app that it suspends while the app holds a file lock in a shared container (`0xdead10cc`). Every call
/// of the package that takes a `flock` holds a permit of this gate from before it takes the lock until after it lets
/// the lock go (``withPermit(toDo:identifier:path:_:)``, or ``enter()`` and ``leave()``). While the gate is suspended
/// (``Wormhole/suspend()``) no permit is given: calls that would lock throw ``WormholeError/Code/suspended`` and write
/// nothing, and background work that would lock (a consumer's mark, reclaiming a queue's space) is put off; calls
/// already holding one finish, and ``permitsHeld`` tells when the last has.
///
/// One atomic word: the suspended flag and the count of permits held. Taking a permit is one atomic add and one test,
/// giving it back one atomic subtraction, so that a pass pays a few nanoseconds for it.
package enum SuspensionGate {
    private static let suspendedFlag = 1 << 62
    private static let state = Atomic<Int>(0)
    /// Told of the gate's state after every change (true when suspended), on ``delivery``: the store module wakes its
    /// consumers through them when the gate opens again.
    private static let observers = Locked<(next: Int, all: [Int: @Sendable (Bool) -> Void])>((0, [:]))
    /// The state ``observers`` were last told, read and written on ``delivery`` only.
    private static let observersTold = Locked(false)
    /// Told of the state before ``suspend()`` or ``resume()`` returns, on the caller's thread and under no lock of the
    /// gate's, so that what follows the call finds them suspended or resumed: the store module suspends and resumes
    /// its databases through them.
    private static let immediateObservers = Locked<[@Sendable (Bool) -> Void]>([])
    /// Whether a thread is telling ``immediateObservers`` now, and the state they were last told.
    private static let immediateTelling = Locked((active: false, told: false))
    /// Where observers are called, one call after another and under no lock: an observer may suspend, resume or
    /// observe in turn, and a call that an observer makes inline (a store's consumer handing a commit) must not hold
    /// up the caller of ``resume()``, the main thread under `followApplicationLifecycle()`.
    private static let delivery = DispatchQueue(label: "wormhole.suspension")

    /// Whether the gate is suspended now.
    package static var isSuspended: Bool { state.load(ordering: .acquiring) & suspendedFlag != 0 }

    /// How many calls hold a permit (and so may hold a lock) now.
    package static var permitsHeld: Int { state.load(ordering: .acquiring) & (suspendedFlag - 1) }

    /// Takes a permit: false, with none taken, while the gate is suspended.
    package static func enter() -> Bool {
        let before = state.wrappingAdd(1, ordering: .acquiring).oldValue
        guard before & suspendedFlag != 0 else { return true }
        // Counted for an instant only: whoever waits for the count to reach 0 sees it a moment later.
        state.wrappingSubtract(1, ordering: .releasing)
        return false
    }

    /// Gives back a permit that ``enter()`` took.
    package static func leave() {
        let before = state.wrappingSubtract(1, ordering: .releasing).oldValue
        // One too many would borrow from the flag and open the gate.
        assert(before & (suspendedFlag - 1) > 0, "a suspension permit was given back that was never taken")
    }

    /// Runs `body` holding a permit; throws ``WormholeError/Code/suspended``, saying that nothing was done, while the
    /// gate is suspended.
    @inline(__always)
    package static func withPermit<T>(
        toDo what: String,
        identifier: String? = nil,
        path: String? = nil,
        _ body: () throws(WormholeError) -> T
    ) throws(WormholeError) -> T {
        guard enter() else { throw WormholeError.suspended(what, identifier: identifier, path: path) }
        defer { leave() }
        return try body()
    }

    /// Suspends the gate; returns whether it was open.
    @discardableResult
    package static func suspend() -> Bool {
        change(suspending: true)
    }

    /// Opens the gate again; returns whether it was suspended.
    @discardableResult
    package static func resume() -> Bool {
        change(suspending: false)
    }

    /// Calls `observer` with the gate's state after every change from now on (with true soon when it is suspended
    /// now), until the observation is cancelled or released, on a queue of the gate's, one call after another. Two
    /// changes in quick succession may be told as one (the state the later made), one state may be told twice, and a
    /// call queued before the cancellation may still come.
    package static func observe(_ observer: @escaping @Sendable (Bool) -> Void) -> NotifierObservation {
        let key = observers.withLock { observers in
            defer { observers.next += 1 }
            observers.all[observers.next] = observer
            return observers.next
        }
        if isSuspended { delivery.async { observers.withLock { $0.all[key] }?(true) } }
        return NotifierObservation { _ = observers.withLock { $0.all.removeValue(forKey: key) } }
    }

    /// Calls `observer` with the gate's state at every ``suspend()`` or ``resume()`` that changes it from now on,
    /// before the call returns, on the caller's thread, for as long as the process runs.
    ///
    /// Observers are told one state at a time, never concurrently; each must be quick, and idempotent (one state may
    /// be told twice). Nothing is told at registration: whoever registers while the gate is suspended acts on
    /// ``isSuspended`` itself. When two threads change the gate at once, the one telling the observers goes on until
    /// they were told the state the later change made, so "before the call returns" holds for that thread; the other
    /// may return a moment before.
    package static func observeImmediately(_ observer: @escaping @Sendable (Bool) -> Void) {
        immediateObservers.withLock { $0.append(observer) }
    }

    private static func change(suspending: Bool) -> Bool {
        let before =
            suspending
            ? state.bitwiseOr(suspendedFlag, ordering: .acquiringAndReleasing).oldValue
            : state.bitwiseAnd(~suspendedFlag, ordering: .acquiringAndReleasing).oldValue
        guard (before & suspendedFlag != 0) != suspending else { return false }
        // The databases first, so that a consumer woken by the queued observers finds them resumed.
        tellImmediateObservers()
        delivery.async(execute: tellObservers)
        return true
    }

    /// Tells the immediate observers the gate's state until what they were last told is the state, unless another
    /// thread is telling them now (an observer that suspends or resumes in turn, or a second caller), which then goes
    /// on until they were told this change too.
    private static func tellImmediateObservers() {
        let starts = immediateTelling.withLock { telling in
            if telling.active { return false }
            telling.active = true
            return true
        }
        guard starts else { return }
        while true {
            let now = isSuspended
            // Checked and given up under the lock: a change made after it finds `active` false and tells itself.
            let observers = immediateTelling.withLock { telling -> [@Sendable (Bool) -> Void]? in
                if telling.told == now {
                    telling.active = false
                    return nil
                }
                telling.told = now
                return immediateObservers.withLock { $0 }
            }
            guard let observers else { return }
            for observer in observers { observer(now) }
        }
    }

    /// Tells the observers the gate's state, when it is not what they were last told; on ``delivery`` only.
    private static func tellObservers() {
        let now = isSuspended
        let changed = observersTold.withLock { told in
            defer { told = now }
            return told != now
        }
        guard changed else { return }
        let all = observers.withLock { $0.all }.sorted { $0.key < $1.key }
        for (_, observer) in all { observer(now) }
    }
}

extension WormholeError {
    /// The error of a call refused while the process's wormholes are suspended.
    package static func suspended(_ what: String, identifier: String? = nil, path: String? = nil) -> WormholeError {
        WormholeError(
            .suspended,
            "Could not \(what): this process's wormholes are suspended (Wormhole.suspend(), or the app went to the "
                + "background), so no file lock may be taken. Nothing was done. Try again after Wormhole.resume().",
            identifier: identifier,
            path: path
        )
    }
}
