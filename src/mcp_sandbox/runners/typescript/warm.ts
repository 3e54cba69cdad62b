/**
 * Imported by the runner before it says READY (see warmUp in runner.ts): a small TypeScript module
 * whose loading makes the runtime's module loader and transpiler do their first-use work then,
 * not on the run's code. It has no effects.
 */

interface Shape {
  readonly name: string;
  size?: number;
}

export type Sized = Shape & { size: number };

export async function measure(shape: Shape): Promise<Sized> {
  await Promise.resolve();
  return { ...shape, size: shape.size ?? 0 };
}
