import Dispatch

/// Runs `body` on a thread that may block (Dispatch's), never on the cooperative pool, and awaits its result: for the
/// `async` forms of synchronous calls that wait for a file lock or a server.
package func runBlocking<Value: Sendable, Failure: Error>(
    _ body: @escaping @Sendable () throws(Failure) -> Value
) async throws(Failure) -> Value {
    let result: Result<Value, Failure> = await withCheckedContinuation { continuation in
        DispatchQueue.global().async {
            do throws(Failure) {
                continuation.resume(returning: .success(try body()))
            } catch {
                continuation.resume(returning: .failure(error))
            }
        }
    }
    return try result.get()
}
