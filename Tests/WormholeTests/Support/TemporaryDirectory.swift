import Foundation
import Testing

/// A fresh directory for one test, removed when the value goes away.
final class TemporaryDirectory: Sendable {
    let path: String

    init() {
        let template = FileManager.default.temporaryDirectory.path + "/wormhole-test-XXXXXX"
        var bytes = Array(template.utf8CString)
        guard let created = mkdtemp(&bytes) else { fatalError("mkdtemp failed: \(String(cString: strerror(errno)))") }
        path = String(cString: created)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    /// A path inside the directory.
    func callAsFunction(_ name: String) -> String { path + "/" + name }
}

/// Polls `condition` every 5 ms until it holds or `timeout` seconds pass; returns whether it held.
/// How many times longer waits may take: 10 under a sanitizer (`scripts/sanitize` sets WORMHOLE_SANITIZER), whose
/// slowdown is not the package's, 1 otherwise.
let sanitizerSlowdown: Double = ProcessInfo.processInfo.environment["WORMHOLE_SANITIZER"] == nil ? 1 : 10

extension Trait where Self == TimeLimitTrait {
    /// A suite's time limit: `minutes` and ``gateAllowance`` more, or 10 times as long under a sanitizer.
    static func limit(minutes: Int) -> Self {
        .timeLimit(.minutes((minutes + gateAllowance) * Int(sanitizerSlowdown)))
    }

    /// Minutes a test may spend waiting at ``BlockingTestGate`` before its body runs: a time limit counts from the
    /// test's start, and on a 2-core machine the gate's two places queue the whole run's blocking bodies, so a test
    /// that starts early may wait minutes for its turn. The limit is there to catch a hang, not the queue.
    static var gateAllowance: Int { 3 }
}

func eventually(timeout: Double = 10, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = Date().addingTimeInterval(timeout * sanitizerSlowdown)
    while Date() < deadline {
        if try condition() { return true }
        usleep(5_000)
    }
    return try condition()
}

/// The POSIX permission bits of a path, without following a final symbolic link.
func permissions(_ path: String) -> Int {
    var status = stat()
    guard lstat(path, &status) == 0 else { return -1 }
    return Int(status.st_mode & 0o7777)
}

/// Runs a blocking call (waiting for a process, starting a server) on a thread of its own and suspends until it
/// returns, so that long tests never hold one of the few threads of Swift's cooperative pool, which every async test
/// and time limit needs. `body` must not record issues (`#expect` needs the test's task): return what to check.
func blocking<Value: Sendable>(_ body: @escaping @Sendable () throws -> Value) async throws -> Value {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try body() }) }.start()
    }
}

/// Runs a synchronous test body that blocks (processes waited for, files watched, callbacks awaited) on a thread of
/// its own, in the test's own task: `#expect` works as anywhere in the test, and none of the few threads of Swift's
/// cooperative pool, which every async test and time limit needs, is held meanwhile.
///
/// Every test that does input and output runs its body this way. At most ``BlockingTestGate/shared``'s width of
/// them run at once: the pool's width used to limit them, and with every test at once a 2-core machine misses the
/// tests' deadlines. A test's time limit counts its wait at the gate too: the limits of such tests are 3 minutes,
/// twice what the whole suite takes here.
func offThePool<Value: Sendable>(_ body: () throws -> Value) async throws -> Value {
    let gate = BlockingTestGate.shared
    await gate.enter()
    do {
        let value = try await withTaskExecutorPreference(DedicatedThreadExecutor()) { try body() }
        await gate.leave()
        return value
    } catch {
        await gate.leave()
        throw error
    }
}

/// A counting gate that suspends, never blocks: the tests' blocking bodies wait their turn here.
actor BlockingTestGate {
    /// As many bodies at once as the machine has processors, and at least 2 (the width of Swift's cooperative pool,
    /// which limited them before): more at once overload a 2-core machine, whose tests then miss their deadlines.
    static let shared = BlockingTestGate(width: max(2, ProcessInfo.processInfo.activeProcessorCount))

    private var available: Int
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(width: Int) { available = width }

    func enter() async {
        if available > 0 {
            available -= 1
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    func leave() {
        if waiting.isEmpty { available += 1 } else { waiting.removeFirst().resume() }
    }
}

/// A task executor whose jobs run on a serial dispatch queue: dispatch's own threads, not the cooperative pool.
final class DedicatedThreadExecutor: TaskExecutor {
    private let queue = DispatchQueue(label: "wormhole.tests.dedicated")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}
