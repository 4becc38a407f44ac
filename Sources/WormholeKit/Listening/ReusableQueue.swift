import Foundation

/// A first-in, first-out list that keeps its storage once emptied: on the path of every message, a push and a pop
/// allocate nothing.
struct ReusableQueue<Element> {
    private var elements: [Element] = []
    private var head = 0

    mutating func append(_ element: Element) { elements.append(element) }

    var isEmpty: Bool { head == elements.count }

    /// The oldest element, removed; nil when none is left.
    mutating func popFirst() -> Element? {
        guard head < elements.count else { return nil }
        defer {
            head += 1
            if head == elements.count {
                elements.removeAll(keepingCapacity: true)
                head = 0
            }
        }
        return elements[head]
    }

    /// Every element left, oldest first, removed.
    mutating func removeAll() -> [Element] {
        defer {
            elements = []
            head = 0
        }
        return Array(elements[head...])
    }
}
