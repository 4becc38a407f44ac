import Foundation

/// What a queue consumer does with a message whose handler throws: how many times it is offered, how long it waits
/// between tries, and whether later messages wait with it.
///
/// A message is offered at most ``maximumAttempts`` times. After a failed attempt `n` it waits
/// `firstDelay × factor^(n-1)`, at most ``maximumDelay``, give or take ``jitter`` (a fraction of the wait, so that
/// many consumers failing at once do not come back at once). After its last attempt it goes to the consumer's dead
/// letters (``WormholeDeadLetters``), with its attempt count and the last error's text, and the consumer moves on.
///
/// The default: 5 attempts, waits of 1 s, 2 s, 4 s and 8 s (±10 %), in ``Order-swift.enum/unordered`` order.
///
/// ```swift
/// let policy = QueueRetryPolicy(maximumAttempts: 3, firstDelay: .milliseconds(200))
/// let strict = QueueRetryPolicy.default.ordered(.strict)
/// ```
public struct QueueRetryPolicy: Sendable, Hashable {
    /// Which order a consumer's messages are handled in when some wait for another attempt.
    public enum Order: Sendable, Hashable {
        /// A message that waits for its next attempt is set aside (durably, with its attempt count) and later
        /// messages flow past it: messages are first offered in append order, and each retried one comes back
        /// when its wait is over. So the order holds among messages that succeed at their first attempt, and no
        /// message is ever handled before an earlier one was first offered.
        case unordered
        /// Later messages wait: the consumer offers the failed message again after its wait, and moves on only
        /// when it succeeded or went to the dead letters. Every message is handled in append order.
        case strict
    }

    /// How many times a message is offered, the first included: at least 1. `Int.max` retries for ever.
    public var maximumAttempts: Int
    /// The wait after the first failed attempt.
    public var firstDelay: Duration
    /// How much longer each wait is than the one before: at least 1.
    public var factor: Double
    /// The longest wait.
    public var maximumDelay: Duration
    /// How far a wait may be from its computed length, as a fraction of it (0.1: ±10 %), between 0 and 1.
    public var jitter: Double
    /// Whether later messages flow past one that waits.
    public var order: Order

    /// Creates a policy; out-of-range values are brought into range (at least 1 attempt, a factor of at least 1, a
    /// jitter between 0 and 1, no negative delay).
    public init(
        maximumAttempts: Int = 5,
        firstDelay: Duration = .seconds(1),
        factor: Double = 2,
        maximumDelay: Duration = .seconds(300),
        jitter: Double = 0.1,
        order: Order = .unordered
    ) {
        self.maximumAttempts = max(1, maximumAttempts)
        self.firstDelay = max(.zero, firstDelay)
        self.factor = factor.isFinite ? max(1, factor) : 1
        self.maximumDelay = max(.zero, maximumDelay)
        self.jitter = jitter.isFinite ? min(1, max(0, jitter)) : 0
        self.order = order
    }

    /// 5 attempts, waits of 1 s, 2 s, 4 s and 8 s (±10 %), later messages flowing past.
    public static let `default` = QueueRetryPolicy()

    /// Retries for ever, in strict order, waiting 1 s, then 2 s, up to a minute: a queue that must never skip a
    /// message, as this package's own session transfers are.
    public static let forever = QueueRetryPolicy(
        maximumAttempts: .max,
        maximumDelay: .seconds(60),
        order: .strict
    )

    /// This policy with another order.
    public func ordered(_ order: Order) -> QueueRetryPolicy {
        var policy = self
        policy.order = order
        return policy
    }

    /// The wait after failed attempt `attempt` (1 for the first), before jitter.
    public func delay(afterAttempt attempt: Int) -> Duration {
        let first = firstDelay.milliseconds / 1000
        // Computed in Double and capped before it can overflow: factor^attempt grows fast.
        let exponent = Double(max(0, attempt - 1))
        let raw = first * pow(factor, min(exponent, 1_000))
        let capped = raw.isFinite ? min(raw, maximumDelay.milliseconds / 1000) : maximumDelay.milliseconds / 1000
        return Self.duration(seconds: capped)
    }

    /// ``delay(afterAttempt:)`` moved by `spread` (between -1 and 1) times ``jitter``.
    func delay(afterAttempt attempt: Int, spread: Double) -> Duration {
        let base = delay(afterAttempt: attempt).milliseconds / 1000
        return Self.duration(seconds: base * (1 + jitter * min(1, max(-1, spread))))
    }

    /// `seconds` as a duration, between 0 and `Int64.max` nanoseconds.
    private static func duration(seconds: Double) -> Duration {
        guard seconds > 0 else { return .zero }
        guard seconds < Double(Int64.max) / 1e9 else { return .nanoseconds(Int64.max) }
        return .nanoseconds(Int64(seconds * 1e9))
    }
}

/// What a queue handler says of a message it was given, when it does not throw.
public enum QueueOutcome: Sendable, Hashable {
    /// Handled: the message is acknowledged.
    case done
    /// Not now: the message is offered again after this long, and the attempt does not count as a failure. In
    /// ``QueueRetryPolicy/Order-swift.enum/unordered`` order later messages flow meanwhile; in
    /// ``QueueRetryPolicy/Order-swift.enum/strict`` order they wait.
    case later(Duration)
}
