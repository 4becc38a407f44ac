import Synchronization
import WormholeKit

/// Collects what listeners receive, from any thread.
final class Collector<Value: Sendable>: Sendable {
    private let storage = Locked<[Value]>([])

    func append(_ value: Value) { storage.withLock { $0.append(value) } }
    var values: [Value] { storage.withLock { $0 } }
    var count: Int { storage.withLock { $0.count } }
}

struct Tap: Codable, Sendable, Equatable {
    var number: Int
}
