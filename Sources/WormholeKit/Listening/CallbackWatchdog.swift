import CWormholeSystem
import Foundation
import Synchronization

/// The thread that watches callback drivers for callbacks that block, every ``tick``; it sleeps while no callback
/// has run for a second, and the next callback wakes it.
final class CallbackWatchdog: Sendable {
    static let shared = CallbackWatchdog()

    static let tick = DispatchTimeInterval.milliseconds(10)
    /// Quiet ticks before it sleeps until the next callback.
    static let ticksBeforeSleeping = 100

    private struct State {
        var drivers: [ObjectIdentifier: CallbackDriver] = [:]
        var started = false
    }

    private let state = Locked(State())
    private let callbacks = Atomic<UInt64>(0)
    private let sleeping = Atomic<Bool>(false)
    private let wakeUp = DispatchSemaphore(value: 0)

    func register(_ driver: CallbackDriver) {
        let start = state.withLock { state -> Bool in
            state.drivers[ObjectIdentifier(driver)] = driver
            defer { state.started = true }
            return !state.started
        }
        if start {
            Thread { [self] in
                nameCurrentThread("wh-watchdog")
                run()
            }.start()
        }
    }

    func unregister(_ driver: CallbackDriver) {
        _ = state.withLock { $0.drivers.removeValue(forKey: ObjectIdentifier(driver)) }
    }

    /// Called as each callback starts: counts it, and wakes the watchdog if it sleeps.
    func noteCallback() {
        // Sequentially consistent, against the watchdog's going to sleep: either it sees this count, or this sees
        // it sleeping.
        callbacks.add(1, ordering: .sequentiallyConsistent)
        if sleeping.load(ordering: .sequentiallyConsistent), sleeping.exchange(false, ordering: .sequentiallyConsistent)
        {
            wakeUp.signal()
        }
    }

    private func run() {
        var quietTicks = 0
        var seen = callbacks.load(ordering: .relaxed)
        while true {
            _ = wakeUp.wait(timeout: .now() + Self.tick)
            let drivers = state.withLock { Array($0.drivers.values) }
            let now = ProcessFacts.coarseMonotonicNanoseconds()
            var busy = false
            for driver in drivers {
                driver.replaceIfBlocked(now: now)
                busy = busy || driver.isInCallback
            }
            let count = callbacks.load(ordering: .relaxed)
            if busy || count != seen {
                quietTicks = 0
                seen = count
                continue
            }
            quietTicks += 1
            guard quietTicks >= Self.ticksBeforeSleeping else { continue }
            quietTicks = 0
            sleeping.store(true, ordering: .sequentiallyConsistent)
            if callbacks.load(ordering: .sequentiallyConsistent) != seen {
                // A callback started meanwhile: stay awake; if its driver already saw this sleep and signalled,
                // take the signal back.
                if !sleeping.exchange(false, ordering: .sequentiallyConsistent) { wakeUp.wait() }
                continue
            }
            wakeUp.wait()
        }
    }
}
