import Foundation

/// A task executor that resumes a task on the wormhole's notifier thread when something there wakes it: for a task
/// that iterates a wormhole's `AsyncSequence` with no hop to another thread per element.
///
/// A task iterating ``Wormhole/messages(withIdentifier:as:deliveringCurrentMessage:)`` runs, by default, on Swift's
/// global executor: each message wakes one of its threads, which on a busy CPU costs a context switch. Give the task
/// this executor as its preference, and the element handed over on the notifier's thread resumes the task right there,
/// once the notifier has finished reading the change, as a ``CallbackExecution/automatic`` callback runs:
///
/// ```swift
/// let wormhole = try Wormhole(applicationGroupIdentifier: "group.com.example.app")
/// let reader = Task(executorPreference: NotifierTaskExecutor()) {
///     for try await tap in wormhole.messages(withIdentifier: "button", as: Tap.self) {
///         print("tapped", tap.number)   // on the notifier's thread, or this executor's queue
///     }
/// }
/// ```
///
/// The task's other jobs (its start, a resumption from an actor or from another thread) run on a serial dispatch
/// queue of the executor's own. The rules of ``CallbackExecution/automatic`` apply: a task that keeps the notifier's
/// thread for more than 20 ms is not waited for (a new thread takes over the notifier's work), and from then on its
/// jobs run on the executor's queue. Code isolated to an actor (the main actor, say) still runs on that actor. The
/// executor runs one job at a time: give each task its own, and know that the task's child tasks (`async let`, task
/// groups) inherit the preference and take turns on it too.
public final class NotifierTaskExecutor: TaskExecutor {
    private let scheduler = InlineScheduler(label: "wormhole.task-executor")

    /// A new executor, for one task.
    public init() {}

    /// Runs `job` on the notifier's thread when enqueued there, after the handler that enqueued it returns;
    /// otherwise on this executor's serial queue.
    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        scheduler.schedule { [self] in job.runSynchronously(on: asUnownedTaskExecutor()) }
    }
}
