import Foundation
import Testing

@testable import WormholeKit

/// `ListeningSequence`, the `AsyncSequence` of every mailbox, live, suite and transfer listener, on its own: what it
/// buffers, how it ends, and that a waiting task gets every element.
@Suite("A ListeningSequence hands its callback's elements to the task that iterates", .limit(minutes: 1))
struct ListeningSequenceTests {
    /// A callback core's handle, which records that it was cancelled and runs `onCancel` (as a mailbox listener
    /// finishes its sequence when cancelled).
    final class Handle: WormholeCancellable {
        private let cancelled = Locked(false)
        let onCancel = Locked<(@Sendable () -> Void)?>(nil)
        func cancel() {
            cancelled.withLock { $0 = true }
            onCancel.withLock { $0 }?()
        }
        var isCancelled: Bool { cancelled.withLock { $0 } }
    }

    /// A sequence, the continuation its start was given, and the handle its start returned.
    static func make(
        _ policy: AsyncThrowingStream<Int, any Error>.Continuation.BufferingPolicy = .unbounded
    ) -> (ListeningSequence<Int>, ListeningSequence<Int>.Continuation, Handle) {
        let handle = Handle()
        let given = Locked<ListeningSequence<Int>.Continuation?>(nil)
        let sequence = ListeningSequence<Int>(bufferingPolicy: policy) { continuation in
            given.withLock { $0 = continuation }
            handle.onCancel.withLock { $0 = { continuation.finish() } }
            return handle
        }
        return (sequence, given.withLock { $0! }, handle)
    }

    static func collect(_ sequence: ListeningSequence<Int>) async throws -> [Int] {
        var elements: [Int] = []
        for try await element in sequence { elements.append(element) }
        return elements
    }

    /// The value of `task`, or an issue when it does not end within `seconds` (it is then cancelled).
    static func value<Value: Sendable>(
        of task: Task<Value, any Error>,
        within seconds: Double = 10,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> Value? {
        guard let outcome = await result(of: task, within: seconds) else {
            Issue.record("the task did not end within \(seconds) s", sourceLocation: sourceLocation)
            return nil
        }
        return try outcome.get()
    }

    /// Checks that the next call throws an error with `code`, and that the one after it ends the iteration.
    static func expectEnd(
        of iterator: inout ListeningSequence<Int>.AsyncIterator,
        throwing code: WormholeError.Code,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async {
        do {
            let element = try await iterator.next()
            Issue.record("\(String(describing: element)) came where the end was due", sourceLocation: sourceLocation)
        } catch {
            #expect(error.code == code, sourceLocation: sourceLocation)
        }
        do {
            let after = try await iterator.next()
            #expect(after == nil, "an element came after the end", sourceLocation: sourceLocation)
        } catch {
            Issue.record("the end was thrown twice: \(error)", sourceLocation: sourceLocation)
        }
    }

    enum Policy: String, CaseIterable {
        case unbounded, newestTwo, oldestTwo

        var policy: AsyncThrowingStream<Int, any Error>.Continuation.BufferingPolicy {
            switch self {
            case .unbounded: .unbounded
            case .newestTwo: .bufferingNewest(2)
            case .oldestTwo: .bufferingOldest(2)
            }
        }

        var kept: [Int] {
            switch self {
            case .unbounded: [1, 2, 3, 4, 5]
            case .newestTwo: [4, 5]
            case .oldestTwo: [1, 2]
            }
        }
    }

    @Test("Elements yielded before iteration are kept as the buffering policy says", arguments: Policy.allCases)
    func buffering(_ policy: Policy) async throws {
        let (sequence, continuation, handle) = Self.make(policy.policy)
        for element in 1...5 { continuation.yield(element) }
        continuation.finish()
        #expect(handle.isCancelled, "finishing ends the callback core")
        #expect(try await Self.collect(sequence) == policy.kept)
    }

    @Test("A task waiting gets the element yielded, even when the policy keeps none")
    func waitingTaskBypassesTheBuffer() async throws {
        let policies: [AsyncThrowingStream<Int, any Error>.Continuation.BufferingPolicy] = [
            .bufferingNewest(0), .bufferingOldest(0),
        ]
        for policy in policies {
            let (sequence, continuation, _) = Self.make(policy)
            continuation.yield(1)  // nobody waits: kept nowhere
            let reader = Task { () -> Int? in
                var iterator = sequence.makeAsyncIterator()
                return try await iterator.next()
            }
            #expect(await eventuallyAwaiting { sequence.channel.isWaiting })
            continuation.yield(2)
            #expect(try await Self.value(of: reader) == 2)
        }
    }

    @Test("The end comes after the buffered elements: its error once, then nil; later yields are dropped")
    func endAfterBuffered() async throws {
        let (sequence, continuation, handle) = Self.make()
        continuation.yield(1)
        continuation.yield(2)
        continuation.finish(throwing: WormholeError(.corruptMessage, "bad"))
        continuation.yield(3)
        continuation.finish()
        #expect(handle.isCancelled)
        var iterator = sequence.makeAsyncIterator()
        #expect(try await iterator.next() == 1)
        #expect(try await iterator.next() == 2)
        await Self.expectEnd(of: &iterator, throwing: .corruptMessage)
        #expect(try await iterator.next() == nil)
    }

    @Test("A task waiting when the sequence finishes gets its error; the callback core is stopped before that")
    func finishWhileWaiting() async throws {
        let (sequence, continuation, handle) = Self.make()
        let reader = Task { () throws -> (WormholeError.Code?, Bool) in
            do {
                for try await _ in sequence {}
                return (nil, handle.isCancelled)
            } catch {
                return ((error as? WormholeError)?.code, handle.isCancelled)
            }
        }
        #expect(await eventuallyAwaiting { sequence.channel.isWaiting })
        let finisher = Thread { continuation.finish(throwing: WormholeError(.remoteFailure, "gone")) }
        finisher.start()
        let (code, stoppedFirst) = try await Self.value(of: reader) ?? (nil, false)
        #expect(code == .remoteFailure)
        #expect(stoppedFirst, "the loop ended while the callback core still ran")
    }

    @Test("A task waiting for elements gets every one yielded from another thread, in order")
    func waitingTaskGetsEverything() async throws {
        let (sequence, continuation, _) = Self.make()
        let count = 20_000
        let reader = Task { try await Self.collect(sequence) }
        let thread = Thread {
            for element in 0..<count {
                continuation.yield(element)
                // Now and then the reader catches up and waits, so both paths (buffered, waiting) are taken.
                if element % 1_000 == 0 { usleep(1_000) }
            }
            continuation.finish()
        }
        thread.start()
        #expect(try await Self.value(of: reader, within: 30) == Array(0..<count))
    }

    @Test("Keeping the newest one, a reader that falls behind gets newer elements only, and the last one")
    func newestOneUnderLoad() async throws {
        let (sequence, continuation, _) = Self.make(.bufferingNewest(1))
        let count = 20_000
        let reader = Task { try await Self.collect(sequence) }
        let thread = Thread {
            for element in 0..<count { continuation.yield(element) }
            continuation.finish()
        }
        thread.start()
        let received = try await Self.value(of: reader, within: 30) ?? []
        #expect(received.last == count - 1)
        #expect(zip(received, received.dropFirst()).allSatisfy { $0 < $1 })
    }

    @Test("Cancelling the waiting task ends the iteration with nil and cancels the callback core")
    func cancellingTheWaitingTask() async throws {
        let (sequence, continuation, handle) = Self.make()
        let reader = Task { try await Self.collect(sequence) }
        continuation.yield(7)
        // The reader took 7 and now waits for the next element: cancelling it wakes it.
        #expect(await eventuallyAwaiting { sequence.channel.isWaiting })
        reader.cancel()
        #expect(try await Self.value(of: reader) == [7])
        #expect(handle.isCancelled)
        continuation.yield(8)
        var iterator = sequence.makeAsyncIterator()
        #expect(try await iterator.next() == nil, "an element yielded after the end was kept")
    }

    @Test("A cancelled task stops even while elements keep coming faster than it takes them")
    func cancelledWhileBusy() async throws {
        let policies: [AsyncThrowingStream<Int, any Error>.Continuation.BufferingPolicy] = [
            .bufferingNewest(1), .unbounded,
        ]
        for policy in policies {
            let (sequence, continuation, handle) = Self.make(policy)
            continuation.yield(0)
            let reader = Task { () -> Int in
                var taken = 0
                for try await element in sequence {
                    taken += 1
                    // The producer keeps the buffer full: the next call never has to wait.
                    continuation.yield(element + 1)
                    if taken == 10 { withUnsafeCurrentTask { $0?.cancel() } }
                    if taken == 1_000 { break }  // ignored the cancellation: the expectation below fails
                }
                return taken
            }
            let taken = try await Self.value(of: reader) ?? 0
            #expect(taken == 11, "the loop goes on past its cancellation by the one element buffered, no further")
            #expect(handle.isCancelled)
        }
    }

    @Test("A task cancelled before it iterates takes what is buffered, then ends")
    func cancelledBeforeIterating() async throws {
        let (sequence, continuation, handle) = Self.make()
        continuation.yield(1)
        let reader = Task { () -> [Int] in
            withUnsafeCurrentTask { $0?.cancel() }
            return try await Self.collect(sequence)
        }
        #expect(try await Self.value(of: reader) == [1])
        #expect(handle.isCancelled)
    }

    @Test("A start that throws ends the sequence with its error; one that finishes at once stops its core at once")
    func startEndsAtOnce() async throws {
        let failing = ListeningSequence<Int> { (_) throws(WormholeError) in
            throw WormholeError(.invalidIdentifier, "no such identifier")
        }
        var iterator = failing.makeAsyncIterator()
        await Self.expectEnd(of: &iterator, throwing: .invalidIdentifier)

        let handle = Handle()
        let finished = ListeningSequence<Int> { continuation in
            continuation.yield(1)
            continuation.finish()
            return handle
        }
        #expect(handle.isCancelled, "the core of a sequence finished in its start was not stopped")
        var finishedIterator = finished.makeAsyncIterator()
        #expect(try await finishedIterator.next() == 1)
        #expect(try await finishedIterator.next() == nil)
    }

    @Test("Releasing a sequence that was never iterated stops its callback core")
    func releaseStops() {
        let handle = Handle()
        do {
            let released = ListeningSequence<Int> { _ in handle }
            _ = released
        }
        #expect(handle.isCancelled)
    }
}
