# Effect evidence, interruptions and operator actions arrive with the execution issue.
