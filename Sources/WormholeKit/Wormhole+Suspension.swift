import Foundation

#if canImport(UIKit) && !os(watchOS)
import UIKit
#endif

/// Suspension: what an app calls before iOS suspends it, so that it holds no file lock in its App Group container.
///
/// iOS ends a suspended app that holds a file lock in a shared container, with the exception code `0xdead10cc`. A
/// wormhole holds a lock only for the few system calls of a write (a pass, a suite update, a consumer's mark of
/// life), and the shared store's SQLite database only during a transaction, never while it waits; but a write may be
/// under way at the moment the app goes to the background. These calls close that window, for every wormhole,
/// session and shared store of the process at once (a process is suspended as a whole).
extension Wormhole {
    /// Stops every wormhole, session and shared store of this process from taking file locks, until ``resume()``.
    ///
    /// From now on a call that would take a lock (a pass, a suite update, opening a queue consumer, coordinating, a
    /// shared store's write) throws ``WormholeError/Code/suspended`` (``StoreError/Code/suspended`` for a store) and
    /// does nothing; background work that would lock (a consumer's mark of life, reclaiming a queue's space, a
    /// store's purge) is put off; once a shared store was opened in the process, its SQLite databases are suspended
    /// through GRDB's `Database.suspendNotification`, which also suspends the app's own GRDB databases that observe
    /// it. Reading, listening, live messages and PostgreSQL wormholes go on, since they take no lock in the container
    /// (but a coordinated wormhole's reads do: ``CoordinatedFileTransiting`` locks them too).
    ///
    /// Calls that hold a lock already finish: call ``waitUntilLocksAreReleased(atMost:)`` inside a background task
    /// to know when the last has. Calling `suspend()` again does nothing. On iOS, tvOS and visionOS,
    /// `followApplicationLifecycle()` calls it when the app or the extension's host goes to the background.
    public static func suspend() {
        SuspensionGate.suspend()
    }

    /// Lets this process's wormholes take file locks again, after ``suspend()``.
    ///
    /// Consumers and observers that were put off catch up: a shared store's remote-change observers read what other
    /// processes committed meanwhile, and queue consumers mark themselves alive at their next interval.
    public static func resume() {
        SuspensionGate.resume()
    }

    /// Whether this process's wormholes are suspended (``suspend()``).
    public static var isSuspended: Bool {
        SuspensionGate.isSuspended
    }

    /// Waits until no call of this process holds a file lock of a wormhole or a session (a shared store's transactions
    /// are interrupted by GRDB), checking every millisecond without blocking a thread; returns true when none does,
    /// false when `limit` ran out first (a suite update whose closure is still running, say).
    ///
    /// Call it after ``suspend()``, within the background task that keeps the app running, and end the task when it
    /// returns. While the process is not suspended new calls may take locks at any time, so the answer says little.
    public static func waitUntilLocksAreReleased(atMost limit: Duration = .seconds(2)) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while SuspensionGate.permitsHeld > 0 {
            guard ContinuousClock.now < deadline else { return false }
            do { try await Task.sleep(for: .milliseconds(1)) } catch { return SuspensionGate.permitsHeld == 0 }
        }
        return true
    }

    #if os(iOS) || os(tvOS) || os(visionOS)
    /// The observations of ``followApplicationLifecycle()``, once it was called.
    private static let lifecycleObservations = Locked<[any NSObjectProtocol]?>(nil)

    /// Suspends this process's wormholes when the app, or an extension's host app, goes to the background, keeping
    /// the process running until the calls under way have let go of their locks (two seconds at most); resumes them
    /// when it comes back to the foreground. Call it once, early (in the app's `init`, or the extension's first view
    /// controller); later calls do nothing.
    ///
    /// It observes `UIApplication.didEnterBackgroundNotification` and `willEnterForegroundNotification` (apps) and
    /// Foundation's `NSExtensionHostDidEnterBackground` and `NSExtensionHostWillEnterForeground` (app extensions:
    /// widgets, keyboards, share extensions), and asks for the time to let go through
    /// `ProcessInfo.performExpiringActivity(withReason:using:)`. An app that works in the background (audio,
    /// location, a background task) calls ``resume()`` when that work starts and ``suspend()`` again when it ends,
    /// as GRDB's guide on sharing a database asks. (A watch app, which gets none of these notifications, calls
    /// ``suspend()`` and ``resume()`` as its scene phase changes.)
    @MainActor
    public static func followApplicationLifecycle() {
        lifecycleObservations.withLock { observations in
            guard observations == nil else { return }
            var names: [(Notification.Name, suspends: Bool)] = [
                (.NSExtensionHostDidEnterBackground, true), (.NSExtensionHostWillEnterForeground, false),
            ]
            #if canImport(UIKit)
            names += [
                (UIApplication.didEnterBackgroundNotification, true),
                (UIApplication.willEnterForegroundNotification, false),
            ]
            #endif
            observations = names.map { name, suspends in
                NotificationCenter.default.addObserver(forName: name, object: nil, queue: nil) { _ in
                    if suspends { suspendKeepingTheProcessUntilReleased() } else { SuspensionGate.resume() }
                }
            }
        }
    }

    /// Suspends, and keeps the process from being suspended by the system until no call holds a lock (or two
    /// seconds have passed, or the system says the time is up).
    private static func suspendKeepingTheProcessUntilReleased() {
        SuspensionGate.suspend()
        ProcessInfo.processInfo.performExpiringActivity(withReason: "Wormhole: letting go of file locks") { expired in
            // Called on a queue of the system's, which may wait: the process runs until this returns.
            guard !expired else { return }
            let deadline = ContinuousClock.now + .seconds(2)
            while SuspensionGate.permitsHeld > 0, ContinuousClock.now < deadline { usleep(1_000) }
        }
    }
    #endif
}
